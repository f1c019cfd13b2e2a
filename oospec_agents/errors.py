"""Exceptions that name the bad input. All are ValueErrors, so callers can catch one type."""


class OoOSpecError(ValueError):
    """Base class for every input error the engine raises."""
    #: the request field it names, for front-ends that report one (OpenAI's error `param`)
    param: str | None = None


class ToolSchemaError(OoOSpecError):
    """A tool definition is malformed: missing name, invalid JSON Schema, duplicate name."""


class UnknownToolError(OoOSpecError):
    """`tool_choice` names a tool that was not offered."""


class ChatFormatError(OoOSpecError):
    """The messages are not a valid chat, or there is no usable chat template to render them."""


class TemplateArgumentError(OoOSpecError):
    """`chat_template_kwargs` or `reasoning_effort` is malformed, or the chat template takes no such argument."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ContextLengthError(OoOSpecError):
    """The prompt does not fit the target's context window."""


class DeviceError(OoOSpecError):
    """A device string is unknown, or names hardware that is not present."""


class ModelLoadError(OoOSpecError):
    """A model reference cannot be resolved to weights."""


class AdapterError(ModelLoadError):
    """A LoRA adapter directory is missing, corrupt, or made for another base model."""


class ResponseFormatError(OoOSpecError):
    """`response_format` is malformed, or its JSON Schema is beyond the grammar."""
    param = "response_format"


class PredictionError(OoOSpecError):
    """`prediction` is not OpenAI's `{"type": "content", "content": ...}` (or a string)."""
    param = "prediction"


class SamplingError(OoOSpecError):
    """A sampling setting (temperature, top_p, top_k, min_p, seed, logprobs) is out of range."""
