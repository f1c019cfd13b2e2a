"""The routes: thin functions over the wire protocol (protocol.py), as vLLM's server has them. Each
reads the request, hands it to the server's state (state.py: checked and queued) and answers through
the one stream/collect path both APIs share (streaming.py). The admin route is admin.py's.
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..errors import TemplateArgumentError
from ..frontend import ParallelToolCalls, choice_count
from .chat_output import ChatFold, Completion
from .extension import Extension, Predictions
from .protocol import ChatCompletionRequest, ResponsesRequest
from .responses_output import ResponsesFold
from .responses_request import RESPONSES_PATH, template_error, to_chat
from .state import ServerState
from .streaming import answer

CHAT_PATH = "/v1/chat/completions"

router = APIRouter()


def served(request: Request) -> ServerState:
    """The state of the app that serves `request` (create_app's)."""
    return request.app.state.oospec


@router.get("/health")
async def health(request: Request):
    state = served(request)
    status = "ok" if state.engine is not None else "failed" if state.load_error else "loading"
    code = {"ok": 200, "loading": 503, "failed": 500}[status]
    return JSONResponse({"status": status, "model": state.model, "replica": state.replica,
                         "queue": state.scheduler.waiting, "error": state.load_error}, status_code=code)


@router.get("/metrics")
async def metrics(request: Request):
    metrics = served(request).metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [served(request).model_object()]}


@router.get("/v1/models/{model:path}")  # `path`: a hub id such as "Qwen/Qwen2.5-7B-Instruct" holds a slash
async def retrieve_model(model: str, request: Request):
    state = served(request)
    state.check_model(model)
    return state.model_object()


@router.post(CHAT_PATH)
async def chat_completions(req: ChatCompletionRequest, request: Request):
    t0, state = time.perf_counter(), served(request)
    ext = Extension.of(req)
    queued, finished = state.submit(req, ext)
    completion = Completion(state.model, state.replica, choice_count(req.n), req.parallel_tool_calls,
                            bool(req.logprobs))
    fold = ChatFold(completion, state.first_token(t0), Predictions() if ext.predicted_calls else None,
                    usage=bool(req.stream_options and req.stream_options.include_usage))
    return await answer(queued, fold, finished, req.stream, request)


@router.post(RESPONSES_PATH)
async def responses(req: ResponsesRequest, request: Request):
    """OpenAI's Responses API, translated to a chat request (responses_request.py) and taking its path.
    A chat template argument the engine refuses (`reasoning.effort`, `chat_template_kwargs`) is a 400
    naming the field as the request gave it, before anything streams, as is a bad `oospec` extension."""
    t0, state = time.perf_counter(), served(request)
    ext = Extension.of(req)
    try:
        queued, finished = state.submit(to_chat(req), ext)
    except TemplateArgumentError as e:
        raise template_error(e, req) from None
    fold = ResponsesFold(state.model, state.replica, req, ParallelToolCalls.openai(req.parallel_tool_calls),
                         state.first_token(t0), Predictions() if ext.predicted_calls else None)
    return await answer(queued, fold, finished, req.stream, request)
