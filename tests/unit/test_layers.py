"""The package's layers, enforced: imports point down only, nothing cycles, and the parts
that need no MPI (the simulator, the model, the CLI's help) never initialise it."""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import ringmpi
from ringmpi.sim import VirtualRank
from ringmpi.transport import Transport

PKG = Path(ringmpi.__file__).parent

#: lowest first; a module may import modules of its own layer or below (never above)
LAYERS = [
    ("leaves", {"errors", "units", "call", "transport", "cost", "ops", "written"}),
    ("memory and settings", {"backend", "settings", "device", "cma"}),
    ("algorithms and models", {"specs", "schedules", "schedules.*", "stall", "requests", "model", "calibrate"}),
    ("simulator", {"sim"}),
    ("choice", {"auto"}),
    ("call pipeline", {"api"}),
    ("collectives", {"collectives"}),
    ("transports", {"mpicomm", "shm"}),
    ("mpi4py drop-in", {"comm", "run"}),
    ("trainer", {"dp", "dp.*", "torch", "torch.*"}),
    ("package and tools", {"__init__", "__main__", "launch", "tools", "tools.*"}),
]
#: the one upward edge: the call pipeline creates the MPI transport at the first call
#: (a function-level import, so that `import ringmpi` never initialises MPI)
ALLOWED_UP = {("api", "mpicomm")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def layer_of(mod: str) -> int:
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if mod == m or (m.endswith(".*") and mod.startswith(m[:-1])):
                return i
    raise AssertionError(f"module ringmpi.{mod} is in no layer: add it to LAYERS")


def resolve(mod: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The ringmpi modules an import statement reads (relative or absolute)."""
    if node.level == 0:
        if not (node.module or "").startswith("ringmpi"):
            return []
        base = node.module.split(".")[1:]
    else:
        here = mod.split(".") if path.name == "__init__.py" and mod != "__init__" else mod.split(".")[:-1]
        if mod == "__init__":
            here = []
        base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
    out = []
    for alias in node.names:
        cand = base + [alias.name]
        as_mod = PKG.joinpath(*cand)
        if as_mod.with_suffix(".py").exists() or (as_mod / "__init__.py").exists():
            out.append(".".join(cand))
        else:
            out.append(".".join(base) or "__init__")
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = module_name(path)
        deps = graph.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text())):  # function-level imports count too
            if isinstance(node, ast.ImportFrom):
                deps.update(d for d in resolve(mod, path, node) if d != mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("ringmpi."))
    return graph


def test_imports_point_down_only():
    bad = []
    for mod, deps in import_graph().items():
        for dep in deps:
            if layer_of(dep) > layer_of(mod) and (mod, dep) not in ALLOWED_UP:
                bad.append(f"ringmpi.{mod} ({LAYERS[layer_of(mod)][0]}) imports ringmpi.{dep} "
                           f"({LAYERS[layer_of(dep)][0]})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph.get(m, ()):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [m, d]))
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2
    for m in graph:
        if m not in state:
            visit(m, [])


def test_only_the_transport_imports_mpi4py():
    offenders = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "mpi4py" or n.startswith("mpi4py.") for n in names):
                offenders.append(module_name(path))
    # the transport, and the drop-in that *is* an mpi4py communicator (it sends nothing itself)
    assert set(offenders) == {"mpicomm", "comm", "run"}, offenders


BLOCKED = "import sys; sys.modules['mpi4py'] = None  # any import of mpi4py now fails\n"


@pytest.mark.parametrize("code", [
    "import ringmpi, ringmpi.sim, ringmpi.cost, ringmpi.model, ringmpi.dp, ringmpi.tools.bench",
    "from ringmpi.tools.cli import main; main(['model', 'segments', '--size', '64e6', '--workers', '8'])",
    "from ringmpi.tools.cli import main; main(['sim', 'table', '--collective', 'alltoall', '--workers', '3'])",
    "from ringmpi.tools.cli import main; main(['sim', 'time', '--size', '1M', '--workers', '4,16'])",
    "from ringmpi.tools.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0",
])
def test_no_mpi_needed(code):
    """The simulator, the model, the package import and the CLI's help run with mpi4py
    unimportable: they cannot initialise MPI."""
    proc = subprocess.run([sys.executable, "-c", BLOCKED + code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def protocol_members(proto: type) -> dict[str, object]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}
    return {n: getattr(proto, n, None) for n in names}


def test_virtual_rank_implements_the_transport_completely():
    """The simulator's transport has every member of the Protocol, with the same parameters
    (the MPI transport is checked the same way under mpirun, tests/mpi/test_layers_mpi.py)."""
    assert_implements(VirtualRank, Transport)


def assert_implements(cls: type, proto: type) -> None:
    for name, member in protocol_members(proto).items():
        impl = getattr(cls, name, None)
        if callable(member):
            assert callable(impl), f"{cls.__name__}.{name} is missing"
            want = list(inspect.signature(member).parameters)
            got = list(inspect.signature(impl).parameters)
            assert got == want, f"{cls.__name__}.{name}{got} differs from {proto.__name__}.{name}{want}"
        else:
            assert name in getattr(cls, "__annotations__", {}) or hasattr(cls, name) or \
                name in inspect.getsource(cls.__init__), \
                f"{cls.__name__} lacks attribute {name}"


def test_the_api_serves_every_spec():
    """The API serves the very specs the simulator and the harnesses use (`ringmpi.specs`:
    one object a collective), each with its public, nonblocking and persistent calls."""
    from ringmpi import collectives, specs
    assert collectives.SPECS is specs.SPECS
    for name, spec in specs.SPECS.items():
        assert collectives.spec(name) is spec
        for call in (name, f"i{name}", f"{name}_init"):
            assert callable(getattr(ringmpi, call)), call
    with pytest.raises(ValueError, match="unknown collective 'gather'; expected one of allreduce"):
        collectives.spec("gather")
