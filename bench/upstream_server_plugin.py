"""A pytest plugin of ours for llama.cpp's own server tests (tools/server/tests of the pinned
tree), loaded with ``-p upstream_server_plugin`` by bench/upstream_server_tests.py; it changes
nothing in upstream's files. It runs the tests offline on one local GGUF:

- ``ServerPreset.load_all`` (the session's model downloads) does nothing;
- the preset of upstream's test model (stories260K, ``ServerPreset.tinyllama2``) gets the local
  GGUF instead of its Hugging Face repo (``--model FILE --offline``);
- a server asked for any other model (embeddings, reranker, infill, vision, MoE, a repo a test
  names), a LoRA adapter, a draft model or any file to download skips its test with "needs ...,
  not available offline";
- every llama-server command line gets the extra arguments (``--sparq ...`` for the SparQ run);
- each server's output goes to a log file of its own, and before a server stops its ``/props``
  (the fork's "sparq" object: settings and counters) is appended to servers.jsonl.

Only the standard library and pytest: it runs in the tests' own venv. Set by the driver:
SPARQ_UT_MODEL (the GGUF), SPARQ_UT_ARGS (a JSON list), SPARQ_UT_LOG_DIR, SPARQ_UT_PORT (the
first port; xdist worker N uses PORT + 10 N, as upstream's conftest does from 8080)."""

from __future__ import annotations

import json
import os
import re
import sys
import types
import urllib.request
from pathlib import Path

import pytest

SKIP_PREFIX = "needs "
# upstream's test model, replaced by the local GGUF: (repo, file) as ServerPreset names them
LOCAL_MODELS = {("ggml-org/test-model-stories260K", None), ("ggml-org/models", "tinyllamas/stories260K.gguf")}
# what the other presets' models are, for the skip messages
KINDS = {
    "bert-bge-small": "an embedding model (bert-bge-small)",
    "jina-reranker": "a reranker (jina-reranker-v1-tiny)",
    "stories260K-infill": "an infill (FIM) model (stories260K-infill)",
    "stories15M_MOE": "a MoE model with its LoRA/draft files (stories15M_MOE)",
    "tinygemma3": "a vision model with its mmproj (tinygemma3)",
    "stories15M-q8_0-00001-of-00003": "a GGUF split in 3 files (stories15M)",
    "test-preset-ci": "the router's preset repo (ggml-org/test-preset-ci)",
}

_state = {"test": "", "n": 0}


def _kind(repo, file) -> str:
    name = f"{repo or ''}/{file or ''}".strip("/")
    for key, kind in KINDS.items():
        if key in name:
            return f"{kind}: {name}"
    return name


def _log_dir() -> Path:
    d = Path(os.environ.get("SPARQ_UT_LOG_DIR") or "sparq_ut_logs")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _record(entry: dict) -> None:
    with open(_log_dir() / "servers.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def _safe(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-150:]


def _patch(utils, worker: int) -> None:
    model = os.environ["SPARQ_UT_MODEL"]
    extra = [str(a) for a in json.loads(os.environ.get("SPARQ_UT_ARGS") or "[]")]
    port = int(os.environ.get("SPARQ_UT_PORT") or 8080) + 10 * worker
    binary = os.environ.get("LLAMA_SERVER_BIN_PATH")

    utils.ServerPreset.load_all = staticmethod(lambda: None)

    def download_file(url, output_file_path=None):
        pytest.skip(f"{SKIP_PREFIX}file {url}, not available offline", allow_module_level=True)

    utils.download_file = download_file

    # llama-server's command line with the extra arguments: utils starts it with
    # subprocess.Popen, so utils sees a subprocess module whose Popen appends them
    real = utils.subprocess

    def popen(args, *a, **kw):
        args = [str(x) for x in args]
        if binary and args and args[0] == binary:
            args = args + extra
            _record({"test": _state["test"], "event": "start", "args": args[1:]})
        return real.Popen(args, *a, **kw)

    shim = types.ModuleType("subprocess_with_extra_args")
    shim.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    shim.Popen = popen
    utils.subprocess = shim

    cls = utils.ServerProcess
    orig_init, orig_start, orig_stop = cls.__init__, cls.start, cls.stop

    def __init__(self, *a, **kw):
        orig_init(self, *a, **kw)
        self.server_port = port

    def start(self, *a, **kw):
        repo, file = self.model_hf_repo, self.model_hf_file
        if self.model_url:
            pytest.skip(f"{SKIP_PREFIX}model {self.model_url}, not available offline")
        if repo or file:
            if (repo, file) not in LOCAL_MODELS:
                pytest.skip(f"{SKIP_PREFIX}model {_kind(repo, file)}, not available offline")
            self.model_hf_repo = self.model_hf_file = None
            self.model_file = model
        if self.mmproj_url:
            pytest.skip(f"{SKIP_PREFIX}an mmproj {self.mmproj_url}, not available offline")
        self.offline = True
        if not self.log_path:
            _state["n"] += 1
            self.log_path = str(_log_dir() / f"{_safe(_state['test'])}.{_state['n']}.log")
        return orig_start(self, *a, **kw)

    def stop(self, *a, **kw):
        proc = getattr(self, "process", None)
        if proc is not None and proc.poll() is None and not self.external_server:
            entry = {"test": _state["test"], "event": "stop", "log": self.log_path, "model": self.model_file}
            try:
                req = urllib.request.Request(self.make_url("/props"))
                if self.api_key:
                    req.add_header("Authorization", f"Bearer {self.api_key}")
                with urllib.request.urlopen(req, timeout=5) as r:
                    entry["sparq"] = json.loads(r.read()).get("sparq")
            except Exception as e:  # noqa: BLE001 (a server that cannot answer is recorded as such)
                entry["props_error"] = f"{type(e).__name__}: {e}"[:200]
            _record(entry)
        return orig_stop(self, *a, **kw)

    cls.__init__, cls.start, cls.stop = __init__, start, stop


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # upstream's conftest (loaded before this hook) has imported utils; the tests' folder is rootdir
    if "utils" not in sys.modules:
        sys.path.insert(0, str(config.rootpath))
    import utils

    worker_id = getattr(config, "workerinput", {}).get("workerid", "gw0")
    _patch(utils, int(worker_id[2:]) if worker_id.startswith("gw") else 0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _state["test"] = item.nodeid
