"""SGLang 0.5.23's own code, loaded for tests on a machine without a GPU.

``make sglang-src`` installs the ``sglang==0.5.23`` wheel without its dependencies, plus the few
small packages named in ``requirements/sglang-test.txt``, into ``.sglang-src/`` (another place:
``SPADE_SGLANG_SRC``). ``load()`` imports from there, unchanged:

* ``sglang.srt.managers.io_struct``: the request structs the HTTP server parses each body into,
* ``sglang.srt.server_args``: ``ServerArgs`` and its command-line parser,
* ``sglang.srt.entrypoints.api_contract``: the schema gate in front of ``/generate``,
* ``sglang.srt.sampling.sampling_params``: the ``SamplingParams`` a ``/generate`` request becomes.

``tool_call_detectors()`` imports the ``qwen25`` and ``qwen3_coder`` tool-call detectors the same way.

Two of io_struct's imports would pull in the whole model runtime (CUDA kernels, torchvision,
flashinfer), so they are built from SGLang's own source with only the definitions io_struct takes
from them (``from_source``): ``managers/schedule_batch.py`` (``ReturnHiddenStatesMode``,
``SamplingLogprobsMode``, ``get_return_hidden_states_mode``; ``Modality`` from
``multimodal/modality.py``; ``MultimodalProcessorOutput``, which only types internal IPC structs, is
an empty class) and ``multimodal/mm_utils.py`` (``has_valid_data``). ``srt/utils/common.py`` does
``import triton`` at the top and uses it only to decorate kernels; an inert placeholder stands in
for that one import and is removed from ``sys.modules`` again, so nothing else in the test process
sees it. The package's ``sglang/__init__.py`` (transformers patches, the frontend language) is
skipped.

What the server's source says without running it (its route table, the keys it writes into
``meta_info``) is read with ``ast`` (``routes``, ``dict_keys_written``).
"""

from __future__ import annotations

import __future__
import ast
import functools
import importlib.machinery
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

REPO = Path(__file__).resolve().parents[1]
PINNED = "0.5.23"


def install_dir() -> Path:
    return Path(os.environ.get("SPADE_SGLANG_SRC") or REPO / ".sglang-src")


def package_dir() -> Path:
    """``.../sglang`` of the pinned wheel; a clear error when ``make sglang-src`` has not run."""
    root = install_dir()
    meta = root / f"sglang-{PINNED}.dist-info"
    if not (root / "sglang" / "srt" / "managers" / "io_struct.py").is_file() or not meta.is_dir():
        raise RuntimeError(
            f"SGLang {PINNED}'s source is not installed at {root} (found: "
            f"{sorted(p.name for p in root.glob('sglang-*.dist-info')) or 'nothing'}); run `make sglang-src` "
            "(or set SPADE_SGLANG_SRC to a --target directory holding requirements/sglang-test.txt)")
    return root / "sglang"


def source(relative: str) -> Path:
    """A file of the package, e.g. ``source("srt/entrypoints/http_server.py")``."""
    return package_dir() / relative


# ------------------------------------------------------------------------------ from source


def _defined_name(node: ast.stmt) -> Optional[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def from_source(module_name: str, path: Path, names: Iterable[str],
                namespace: Optional[dict] = None) -> types.ModuleType:
    """A module holding only the top-level definitions ``names`` of SGLang's file ``path``, run as
    written there (with ``from __future__ import annotations`` and ``typing``'s names, as the
    file has them) in ``namespace``'s globals. A name the file no longer defines is an error."""
    wanted = set(names)
    tree = ast.parse(path.read_text(), str(path))
    keep = [node for node in tree.body if _defined_name(node) in wanted]
    missing = wanted - {_defined_name(node) for node in keep}
    if missing:
        raise LookupError(f"{path} no longer defines {sorted(missing)} at top level")
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    exec("from typing import *", module.__dict__)  # noqa: S102 - the file's own typing imports
    module.__dict__.update(namespace or {})
    code = compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102
    return module


class _Inert(types.ModuleType):
    """Every attribute is another inert object; calling one as a decorator returns the function."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any
        if name[:1].isupper():
            value = type(name, (), {"__init__": lambda self, *a, **k: None})
        else:
            value = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn


@dataclass(frozen=True)
class SGLang:
    io_struct: types.ModuleType
    server_args: types.ModuleType
    api_contract: types.ModuleType
    api_types: types.ModuleType  # sglang.api.v1.api_types: the /generate schema
    sampling_params: types.ModuleType
    schedule_batch_part: types.ModuleType  # the FINISH_* classes, from schedule_batch.py
    serializer: type  # srt/utils/common.py MultiprocessingSerializer (tensor payloads)
    version: str


def _import_all() -> tuple:
    import sglang.api.v1.api_types as api_types
    import sglang.srt.entrypoints.api_contract as api_contract
    import sglang.srt.managers.io_struct as io_struct
    import sglang.srt.sampling.sampling_params as sampling_params
    import sglang.srt.server_args as server_args
    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.version import __version__

    return io_struct, server_args, api_contract, api_types, sampling_params, MultiprocessingSerializer, __version__


_LOADED: list[str] = []  # the sys.path entry and module names load() added, for unload()


@functools.lru_cache(maxsize=1)
def load() -> SGLang:
    """SGLang's modules (see the module docstring). They stay in ``sys.modules`` (SGLang imports
    some of its own modules lazily) until ``unload()``; a test module calls that when it is done,
    so the rest of the test process sees no ``sglang`` (``tests/rollout/test_runtime_versions.py`` checks
    that this venv has none)."""
    present = None if _LOADED else sys.modules.get("sglang")
    if present is not None:  # a real installation already imported (the GPU image): use it as it is
        modules = _import_all()
        if modules[-1] != PINNED:
            raise RuntimeError(f"the imported sglang is {modules[-1]}, spade pins {PINNED}")
        pkg = Path(present.__path__[0])
    else:
        pkg = package_dir()
        modules = _load_from(pkg)
    finish = from_source("sglang_finish_reasons", pkg / "srt/managers/schedule_batch.py",
                         ["BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISH_LENGTH",
                          "FINISH_ABORT"])
    io_struct, server_args, api_contract, api_types, sampling_params, serializer, version = modules
    if version != PINNED:
        unload()
        raise RuntimeError(f"{pkg} is SGLang {version}, spade pins {PINNED}: rerun `make sglang-src`")
    return SGLang(io_struct, server_args, api_contract, api_types, sampling_params, finish, serializer, version)


def _put_on_path(pkg: Path) -> tuple[str, set[str]]:
    """``.sglang-src`` on ``sys.path`` and an empty ``sglang`` package in front of its
    ``__init__.py`` (unless an earlier call did that); returns the path entry and the modules
    imported before."""
    root = str(pkg.parent)
    before = set(sys.modules)
    if "sglang" in sys.modules:  # put there by an earlier call (load() or tool_call_detectors())
        return root, before
    sys.path.insert(0, root)
    _LOADED.append(root)
    top = types.ModuleType("sglang")
    top.__path__ = [str(pkg)]
    top.__file__ = str(pkg / "__init__.py")
    top.__spec__ = importlib.machinery.ModuleSpec("sglang", None, origin=top.__file__, is_package=True)
    top.__spec__.submodule_search_locations = [str(pkg)]
    sys.modules["sglang"] = top
    return root, before


def _record(root: str, before: set[str]) -> None:
    """SGLang's modules and the few packages .sglang-src adds (msgspec, orjson, IPython, ...), not
    the modules of .venv they imported (torch, pydantic, ...): those stay as they are."""
    def from_root(module: types.ModuleType) -> bool:  # a namespace package has a __path__ only
        own = getattr(module, "__dict__", {})  # not getattr: lazy modules import on a miss
        places = [own.get("__file__") or "", *(own.get("__path__") or [])]
        return any(str(place).startswith(root) for place in places)

    _LOADED.extend(sorted(name for name in set(sys.modules) - before
                          if name == "sglang" or name.startswith("sglang.") or from_root(sys.modules[name])))


def _load_from(pkg: Path) -> tuple:
    import torch  # noqa: F401 - imported before the triton placeholder exists: torch sees no triton

    root, before = _put_on_path(pkg)
    had_triton = "triton" in sys.modules
    if not had_triton:
        triton = _Inert("triton")
        triton.__path__ = []
        triton.__spec__ = importlib.machinery.ModuleSpec("triton", None, is_package=True)
        sys.modules["triton"] = triton
    try:
        from sglang.srt.multimodal.modality import Modality

        srt = pkg / "srt"
        batch = from_source("sglang.srt.managers.schedule_batch", srt / "managers/schedule_batch.py",
                            ["ReturnHiddenStatesMode", "SamplingLogprobsMode", "get_return_hidden_states_mode"],
                            {"Modality": Modality})
        batch.MultimodalProcessorOutput = type("MultimodalProcessorOutput", (), {})
        sys.modules[batch.__name__] = batch
        from sglang.srt.utils import flatten_nested_list

        mm = from_source("sglang.srt.multimodal.mm_utils", srt / "multimodal/mm_utils.py", ["has_valid_data"],
                         {"flatten_nested_list": flatten_nested_list})
        sys.modules[mm.__name__] = mm
        return _import_all()
    finally:
        if not had_triton:
            for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
                del sys.modules[name]
        _record(root, before)


def unload() -> None:
    """Take out of ``sys.path`` and ``sys.modules`` what ``load()`` put there (the objects already
    handed out keep working; a new ``load()`` imports afresh)."""
    while _LOADED:
        entry = _LOADED.pop()
        if entry in sys.modules:
            del sys.modules[entry]
        elif entry in sys.path:
            sys.path.remove(entry)
    # SGLang's modules imported after load() returned (lazily, by a test) are not in _LOADED; one
    # left behind without its parent breaks the next import of the package (KeyError 'sglang.srt')
    for name in [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]:
        del sys.modules[name]
    load.cache_clear()
    tool_call_detectors.cache_clear()
    reasoning_parser.cache_clear()


@dataclass(frozen=True)
class Detectors:
    """SGLang's tool-call detectors (``srt/function_call/``) and the request's ``Tool`` model."""

    tool: type  # sglang.srt.entrypoints.openai.protocol.Tool
    qwen25: type  # qwen25_detector.Qwen25Detector (``--tool-call-parser qwen`` / ``qwen25``)
    qwen3_coder: type  # qwen3_coder_detector.Qwen3CoderDetector


@functools.lru_cache(maxsize=1)
def tool_call_detectors() -> Detectors:
    """The tool-call detectors of the pinned wheel, imported unchanged (``sglang/utils.py``, on
    their import chain, needs IPython and ``base_format_detector.py`` partial_json_parser: both in
    requirements/sglang-test.txt). Like ``load()`` they stay until ``unload()``."""
    def imported() -> Detectors:
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.qwen3_coder_detector import Qwen3CoderDetector
        from sglang.srt.function_call.qwen25_detector import Qwen25Detector
        from sglang.version import __version__

        if __version__ != PINNED:
            raise RuntimeError(f"the imported sglang is {__version__}, spade pins {PINNED}: rerun `make sglang-src`")
        return Detectors(Tool, Qwen25Detector, Qwen3CoderDetector)

    if "sglang" in sys.modules and not _LOADED:  # a real installation is imported (the GPU image)
        return imported()
    root, before = _put_on_path(package_dir())
    try:
        return imported()
    finally:
        _record(root, before)



@functools.lru_cache(maxsize=1)
def reasoning_parser() -> types.ModuleType:
    """``sglang.srt.parser.reasoning_parser`` of the pinned wheel (its import chain needs what the
    tool-call detectors need: partial_json_parser, IPython, traitlets). Like ``load()`` it stays
    until ``unload()``."""
    name = "sglang.srt.parser.reasoning_parser"
    if "sglang" in sys.modules and not _LOADED:  # a real installation is imported (the GPU image)
        return importlib.import_module(name)
    root, before = _put_on_path(package_dir())
    try:
        return importlib.import_module(name)
    finally:
        _record(root, before)

# ------------------------------------------------------------------------------ read by ast


@dataclass(frozen=True)
class Route:
    path: str
    methods: frozenset[str]
    function: str
    body: Optional[str]  # the request struct the body is parsed into (a class of io_struct), or None
    line: int


_DECORATOR_METHODS = {"get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE", "patch": "PATCH"}


def _body_class(fn: ast.AsyncFunctionDef | ast.FunctionDef) -> Optional[str]:
    """The class a route's JSON body is parsed into: a parameter annotated ``X`` (a dataclass
    FastAPI reads from the body) or ``Annotated[X, Body()]`` / ``Annotated[Optional[X], Body()]``."""
    for arg in fn.args.args + fn.args.kwonlyargs:
        ann = arg.annotation
        if ann is None:
            continue
        if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "Annotated":
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if any(isinstance(p, ast.Call) and getattr(p.func, "id", None) == "Body" for p in parts[1:]):
                inner = parts[0]
                if isinstance(inner, ast.Subscript) and getattr(inner.value, "id", None) == "Optional":
                    inner = inner.slice
                return ast.unparse(inner)
        elif isinstance(ann, ast.Name) and ann.id.endswith(("ReqInput", "Req")):
            return ann.id
    return None


def routes(path: Optional[Path] = None) -> dict[str, Route]:
    """The HTTP server's route table: ``@app.get/post/...(path)`` and ``@app.api_route(path,
    methods=[...])`` decorators of ``srt/entrypoints/http_server.py``, read with ``ast``."""
    path = path or source("srt/entrypoints/http_server.py")
    table: dict[str, Route] = {}
    for fn in ast.walk(parsed(path)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app"):
                continue
            kind = dec.func.attr
            if not dec.args or not isinstance(dec.args[0], ast.Constant):
                continue
            route_path = dec.args[0].value
            if kind == "api_route":
                methods = {"GET"}  # FastAPI's default
                for kw in dec.keywords:
                    if kw.arg == "methods":
                        methods = set(ast.literal_eval(kw.value))
            elif kind in _DECORATOR_METHODS:
                methods = {_DECORATOR_METHODS[kind]}
            else:
                continue
            old = table.get(route_path)
            merged = set(methods) | (set(old.methods) if old else set())
            table[route_path] = Route(route_path, frozenset(merged), fn.name, _body_class(fn), dec.lineno)
    return table


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree (parsed once per test process)."""
    return ast.parse(path.read_text(), str(path))


def function_def(path: Path, name: str, cls: Optional[str] = None) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The definition of function ``name`` (a method of class ``cls`` when given) in ``path``."""
    tree = parsed(path)
    scope: Iterable[ast.AST] = tree.body
    if cls is not None:
        owner = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        if not owner:
            raise LookupError(f"{path}: no class {cls}")
        scope = owner[0].body
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(f"{path}: no function {cls + '.' if cls else ''}{name}")


def dict_keys_written(fn: ast.AST, variable: str) -> dict[str, int]:
    """The string keys a function puts into dict ``variable``: ``variable = {...}``,
    ``variable["k"] = ...``, ``variable.update({...})``, ``variable.setdefault("k", ...)``; each
    with the line that writes it first."""
    keys: dict[str, int] = {}

    def add(key: ast.AST, line: int) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.setdefault(key.value, line)

    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == variable and isinstance(node.value, ast.Dict):
                    for k in node.value.keys:
                        if k is not None:
                            add(k, k.lineno)
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and target.value.id == variable):
                    add(target.slice, target.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == variable and node.args):
            if node.func.attr == "update" and isinstance(node.args[0], ast.Dict):
                for k in node.args[0].keys:
                    if k is not None:
                        add(k, k.lineno)
            elif node.func.attr == "setdefault":
                add(node.args[0], node.lineno)
    return keys
