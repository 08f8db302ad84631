"""The ship step (``diversed-hf ship``, ``diversed_hf.cli.ship``): the one writer of the testbed's assets.

A script stages what it would ship in its own run folder; :func:`ship` copies it into the assets with its card. The
last tests read every script and module (``ast``) for a write whose path comes from an asset folder: only the ship
module may write there.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from diversed_hf import testbed
from diversed_hf.cli import main as cli_main
from diversed_hf.cli import ship
from diversed_hf.lab.cli_utils import check_output_dir, check_output_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def assets(tmp_path, monkeypatch):
    folder = tmp_path / "assets"
    (folder / "smollm2" / "eagle").mkdir(parents=True)
    (folder / "smollm2" / "eagle" / "config.json").write_text(json.dumps({"model_type": "eagle_draft"}))
    (folder / "smollm2" / "eagle" / "model.safetensors").write_bytes(b"weights")
    (folder / "smollm2" / "eagle" / "generation_config.json").write_text('{"num_assistant_tokens": 2}')
    monkeypatch.setattr(testbed, "ASSETS_DIR", folder)
    return folder


def test_a_staged_shipment_replaces_its_files_and_keeps_the_folders_others(tmp_path, assets):
    run, cards = tmp_path / "results" / "everyday", tmp_path / "model_cards"
    cards.mkdir()
    files = {"generation_config.json": '{"num_assistant_tokens": 3}', "README.md": "# card\n"}
    staged = ship.stage(run, "smollm2/eagle", files, card="smollm2_eagle_draft.md", measured_by="python x.py")
    assert staged == run / "shipments" / "smollm2__eagle"
    assert json.loads((staged / "shipment.json").read_text())["measured_by"] == "python x.py"
    written = ship.ship(run, cards_dir=cards)
    eagle = assets / "smollm2" / "eagle"
    assert set(written) == {eagle / "generation_config.json", eagle / "README.md", cards / "smollm2_eagle_draft.md"}
    assert json.loads((eagle / "generation_config.json").read_text()) == {"num_assistant_tokens": 3}
    assert (eagle / "model.safetensors").read_bytes() == b"weights"  # not named by the shipment: kept
    assert (cards / "smollm2_eagle_draft.md").read_text() == "# card\n"
    assert not list(eagle.glob(".*"))  # no temporary left behind


def test_a_shipment_ships_under_another_name_and_a_stage_replaces_the_last_whole(tmp_path, assets):
    run = tmp_path / "run"
    ship.stage(run, "smollm2/eagle", {"a.json": "{}", "b.json": "{}"})
    ship.stage(run, "smollm2/eagle", {"a.json": '{"x": 1}'})  # b.json no longer staged
    ship.ship(run, "smollm2/eagle_v2", cards_dir=tmp_path)
    assert sorted(p.name for p in (assets / "smollm2" / "eagle_v2").iterdir()) == ["a.json"]


def test_a_saved_model_folder_ships_whole_under_the_name_given_with_its_card(tmp_path, assets):
    folder, cards = tmp_path / "runs" / "judge", tmp_path / "cards"
    folder.mkdir(parents=True)
    cards.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text("judge card")
    ship.ship(folder, "judges/arith", card="judge_arith.md", cards_dir=cards)
    assert (assets / "judges" / "arith" / "config.json").is_file()
    assert (cards / "judge_arith.md").read_text() == "judge card"
    with pytest.raises(ValueError, match=r"saved model folder, not a staged run: name the asset .* with --as"):
        ship.ship(folder)


@pytest.mark.parametrize("name", ["../outside", "/abs/path", "a//b", "smollm2/./eagle", "", "a b"])
def test_a_name_outside_the_assets_is_refused_by_name(tmp_path, assets, name):
    ship.stage(tmp_path / "run", "smollm2/eagle", {"a.json": "{}"})
    with pytest.raises(ValueError, match=r"--as=.* is not an asset folder: give a relative path"):
        ship.ship(tmp_path / "run", name)


def test_bad_runs_are_refused_by_name(tmp_path, assets):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"RUN=.* holds no staged shipment"):
        ship.ship(tmp_path / "empty")
    (tmp_path / "measured").mkdir()  # a benchmark's folder with nothing staged: not a model to ship whole
    (tmp_path / "measured" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match=r"RUN=.* holds no staged shipment"):
        ship.ship(tmp_path / "measured", "smollm2/eagle")
    run = tmp_path / "run"
    ship.stage(run, "smollm2/eagle", {"a.json": "{}"})
    ship.stage(run, "heads/arith", {"a.json": "{}"})
    with pytest.raises(ValueError, match=r"--as='x' names one asset but RUN=.* stages 2 shipments"):
        ship.ship(run, "x")
    with pytest.raises(ValueError, match=r"--card='c.md' is for a saved model folder"):
        ship.ship(run, card="c.md")
    with pytest.raises(ValueError, match=r"card='c.md' needs a README.md"):
        ship.stage(run, "heads/arith", {"a.json": "{}"}, card="c.md")


def test_a_head_is_refused_over_a_draft(tmp_path, assets):
    head_config = json.dumps({"draft_hidden_size": 8, "target_hidden_size": 8})
    ship.stage(tmp_path / "run", "smollm2/eagle", {"config.json": head_config})
    with pytest.raises(ValueError, match=r"holds a head config but .* holds a eagle_draft: ship it under another"):
        ship.ship(tmp_path / "run")


def test_the_command_ships_and_ends_bad_input_as_one_line(tmp_path, assets, capsys):
    run = tmp_path / "run"
    ship.stage(run, "smollm2/eagle", {"generation_config.json": "{}"})
    assert cli_main(["ship", str(run), "--cards-dir", str(tmp_path)]) == 0
    assert str(assets / "smollm2" / "eagle" / "generation_config.json") in capsys.readouterr().out
    assert cli_main(["ship", str(tmp_path / "nothing")]) == 2
    assert "diversed-hf ship: " in capsys.readouterr().err


def test_a_recipe_output_in_the_assets_is_written_in_the_run_then_shipped(tmp_path, assets):
    destination = ship.save_location(assets / "smollm2" / "eagle", "--save_to", tmp_path / "run")
    assert destination.ship_as == "smollm2/eagle" and destination.folder.is_relative_to(tmp_path / "run")
    destination.folder.mkdir(parents=True)
    (destination.folder / "config.json").write_text(json.dumps({"model_type": "eagle_draft"}))
    destination.finish()
    assert json.loads((assets / "smollm2" / "eagle" / "config.json").read_text()) == {"model_type": "eagle_draft"}
    elsewhere = ship.save_location(tmp_path / "mine", "--save_to", tmp_path / "run")
    assert elsewhere.folder == tmp_path / "mine" and elsewhere.finish() == []
    whole = ship.save_location(assets, "--output-dir", tmp_path / "work")  # a whole testbed: each folder by name
    (whole.folder / "tokenizer").mkdir(parents=True)
    (whole.folder / "tokenizer" / "tokenizer.json").write_text("{}")
    whole.finish()
    assert (assets / "tokenizer" / "tokenizer.json").is_file()


def test_no_run_writes_into_the_package():
    inside = Path(ship.__file__).parent / "out"
    with pytest.raises(ValueError, match=r"`--save_to` .* is inside the package .* `diversed-hf ship RUN --as NAME`"):
        check_output_dir(inside, "--save_to")
    with pytest.raises(ValueError, match=r"`--output` .* is inside the package"):
        check_output_file(inside / "results.json", "--output")


# -- static: who writes into the assets ----------------------------------------------------------------------------

#: calls that write the path they are given: name -> which argument is the path ("self": the receiver)
WRITERS = {
    "write_text_atomic": 0,
    "write_text": "self",
    "write_bytes": "self",
    "mkdir": "self",
    "touch": "self",
    "save_pretrained": 0,
    "to_json_file": 0,
    "save": "self_or_0",
    "copyfile": 1,
    "copy": 1,
    "copy2": 1,
    "copytree": 1,
    "move": 1,
    "replace": 1,
    "rename": 1,
    "write_card": "output_or_0",
    "savefig": 0,
}
#: the functions that return asset folders (and any ``shipped_*``), and the testbed's modules (``getattr(smollm2, name)`` is a folder)
ASSET_CALLS = {"head_folder", "shipped_head_dirs", "shipped_models", "judge_folder"}
TESTBED_MODULES = {"testbed", "smollm2", "smollm2_tuned"}


def _asset_constants() -> set[str]:
    """Names of the testbed's module-level folders inside its assets (``ASSETS_DIR``, ``EAGLE_DIR``, ...)."""
    from diversed_hf.testbed import smollm2, smollm2_tuned

    root = Path(testbed.__file__).parent / "assets"
    names = {"ASSETS_DIR"}
    for module in (testbed, smollm2, smollm2_tuned):
        for name, value in vars(module).items():
            if isinstance(value, Path) and value.resolve().is_relative_to(root.resolve()):
                names.add(name)
    return names


def _mentions(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` builds a path from an asset folder (a ``relative_to`` of one is a name, not a path)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "relative_to":
        return False
    if isinstance(node, ast.Name) and node.id in tainted:
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _names_the_package(node.value):
        return True
    if isinstance(node, ast.Attribute) and node.attr in tainted:
        return True
    if isinstance(node, ast.Call):
        function = node.func
        called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
        if called in ASSET_CALLS or (called or "").startswith("shipped_"):
            return True
        if called == "getattr" and node.args and getattr(node.args[0], "id", None) in TESTBED_MODULES:
            return True
    return any(_mentions(child, tainted) for child in ast.iter_child_nodes(node))


def _names_the_package(text: str) -> bool:
    """A path literal inside the package: ``"diversed_hf"`` as a path part, or the assets' folder."""
    parts = text.replace("\\", "/").split("/")
    return "diversed_hf" in parts[:-1] or text == "diversed_hf" or "testbed/assets" in text


def _written_path(call: ast.Call) -> ast.AST | None:
    function = call.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    where = WRITERS.get(name)
    if where is None:
        return None
    receiver = function.value if isinstance(function, ast.Attribute) else None
    if where == "output_or_0":
        output = next((kw.value for kw in call.keywords if kw.arg == "output"), None)
        return output if output is not None else (call.args[0] if call.args else None)
    if where == "self_or_0":
        return call.args[0] if call.args else receiver
    if where == "self":
        return receiver
    if name in ("replace", "rename") and getattr(receiver, "id", None) != "os":
        return None  # str.replace, or a path moved within its own folder
    return call.args[where] if len(call.args) > where else None


def _walk_scope(scope: ast.AST):
    """The nodes of ``scope`` without those of the functions defined in it (each is its own scope)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _tainted(body: list[ast.AST], sources: set[str]) -> set[str]:
    """``sources`` and the names a scope assigns from them (from names assigned from them, three deep)."""
    tainted = set(sources)
    for _ in range(3):
        for node in body:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.For, ast.comprehension, ast.withitem)):
                fields = ("value", "iter", "context_expr")
                value = next((getattr(node, field) for field in fields if getattr(node, field, None)), None)
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                targets += [getattr(node, "optional_vars", None)]
                if value is not None and _mentions(value, tainted):
                    tainted |= {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
    return tainted


def _parameters(function: ast.FunctionDef) -> list[str]:
    return [arg.arg for arg in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)]


def _writing_parameters(function: ast.FunctionDef) -> set[str]:
    """The parameters of ``function`` that a write's path is built from (each followed alone)."""
    body = list(_walk_scope(function))
    writing = set()
    for parameter in _parameters(function):
        tainted = _tainted(body, {parameter})
        for node in body:
            written = _written_path(node) if isinstance(node, ast.Call) else None
            if written is not None and _mentions(written, tainted):
                writing.add(parameter)
    return writing


def _passes_to_a_writer(call: ast.Call, writers: dict[str, tuple[list[str], set[str]]], tainted: set[str]) -> bool:
    """Whether ``call`` of a function of the same file hands an asset folder to a parameter it writes into."""
    name = getattr(call.func, "id", None)
    if name not in writers:
        return False
    parameters, writing = writers[name]
    passed = list(zip(parameters, call.args)) + [(kw.arg, kw.value) for kw in call.keywords]
    return any(parameter in writing and _mentions(value, tainted) for parameter, value in passed)


def asset_writes(path: Path, constants: set[str]) -> list[str]:
    """``file:line`` of each write in ``path`` whose path comes from an asset folder: names assigned from one inside
    a function count as one, and so does a call of a function of the file that writes into the parameter given one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    writers = {function.name: (_parameters(function), _writing_parameters(function)) for function in functions}
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    found = []
    for scope in [tree, *functions]:
        body = list(_walk_scope(scope))
        tainted = _tainted(body, constants)
        for node in body:
            if not isinstance(node, ast.Call):
                continue
            written = _written_path(node)
            if (written is not None and _mentions(written, tainted)) or _passes_to_a_writer(node, writers, tainted):
                found.append(f"{shown}:{node.lineno}")
    return sorted(set(found))


def _sources():
    for folder in ("benchmarks", "training"):
        yield from sorted((REPO / folder).glob("*.py"))
    yield from (p for p in sorted((REPO / "diversed_hf").rglob("*.py")) if p != Path(ship.__file__))


def test_nothing_but_the_ship_step_writes_into_the_assets():
    constants = _asset_constants()
    assert {"ASSETS_DIR", "EAGLE_DIR", "TUNED_EAGLE_DIR"} <= constants
    writes = [where for path in _sources() for where in asset_writes(path, constants)]
    assert not writes, f"these write into the testbed's assets: stage and ship instead (diversed_hf.cli.ship): {writes}"


def test_the_writer_check_catches_a_write_into_the_assets(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "from diversed_hf.testbed.smollm2 import EAGLE_DIR\n"
        "def f(text):\n"
        "    folder = EAGLE_DIR / 'x'\n"
        "    (folder / 'a.json').write_text(text)\n"
        "def g(model):\n"
        "    model.save_pretrained(EAGLE_DIR)\n"
        "def h(text):\n"
        "    name = EAGLE_DIR.relative_to(EAGLE_DIR.parent)\n"
        "    (REPO / 'results' / name).write_text(text)\n"
        "def save(text, folder):\n"
        "    (folder / 'b.json').write_text(text)\n"
        "def main(args):\n"
        "    adapter = Path(args.adapter) if args.adapter else TUNED_DIR\n"
        "    save('{}', folder=adapter)\n"
        "    save('{}', REPO / 'results')\n"
        "def literal(text):\n"
        "    (REPO / 'diversed_hf' / 'testbed' / 'x.json').write_text(text)\n"
        "    Path('diversed_hf/testbed/assets/y.json').write_text(text)\n"
    )
    assert asset_writes(script, _asset_constants()) == [
        "probe.py:14",
        "probe.py:17",
        "probe.py:18",
        "probe.py:4",
        "probe.py:6",
    ]
