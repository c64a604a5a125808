"""The layout's import rules, read from the source (ast), with no exception: data flows one way,
`indexed_dataset` <- `preprocess`, `samplers` <- `trainer`, and nothing imports `benchmarks`; inside a
room no module imports itself back (a registry and its members share types through a third module).

Inside `trainer/` imports run one way between its folders too: no two folders (packages; each top-level
module counts as its own) import each other, around any loop. The model families (`trainer/models/<family>/`)
import the core; the core never imports a family, the registry (`trainer.models`) or anything that does:
the entry layers at the top (`TRAINER_ENTRIES`: the CLIs, the Python API, `train()`) hand the registry's
specs down. No module outside `trainer/models/` imports a family's module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("indexed_dataset", "preprocess", "samplers", "trainer")
OURS = (*ROOMS, "benchmarks", "tests")
# The top of `trainer/`: the modules that may import the registry and hand its specs down to the core.
TRAINER_ENTRIES = ("trainer", "trainer.cli", "trainer.api", "trainer.train")
REGISTRY = "trainer.models"
# What each room may import of ours, besides itself (module prefixes).
ALLOWED = {
    "indexed_dataset": (),
    "preprocess": ("indexed_dataset",),
    "samplers": ("indexed_dataset",),
    "trainer": ("indexed_dataset", "samplers", "preprocess.tokenizers"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for room in ROOMS for path in sorted((ROOT / room).rglob("*.py"))}


def _imported(name: str, path: Path) -> set[str]:
    """Every module `path` names in an import statement (also inside functions), made absolute;
    `from package import name` also yields `package.name` (it may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a `package.name` that is no module counts as `package`)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in _imported(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_the_rooms_below_it(room):
    broken = []
    for name, path in _modules().items():
        if not _is_under(name, room):
            continue
        for target in sorted(_imported(name, path)):
            top = target.split(".")[0]
            if top in OURS and top != room and not any(_is_under(target, p) for p in ALLOWED[room]):
                broken.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("room", ROOMS)
def test_no_import_cycle_inside_a_room(room):
    graph = {name: {t for t in targets if _is_under(t, room)}
             for name, targets in _graph().items() if _is_under(name, room)}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_nothing_imports_the_benchmarks():
    users = [f"{path.relative_to(ROOT)} imports {target}" for path in sorted((ROOT / "tests").rglob("*.py"))
             for target in sorted(_imported(_module_name(path), path)) if _is_under(target, "benchmarks")]
    assert not users, "\n".join(users)


def test_the_checks_see_a_cycle_and_a_relative_import():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    module = ROOT / "indexed_dataset" / "arrow.py"
    assert "indexed_dataset.rows" in _imported("indexed_dataset.arrow", module)


def _folder(name: str) -> str | None:
    """The folder (package) under `trainer/` of a trainer module; None for `trainer/`'s own top level (`train`,
    `config`, `errors`: modules, not folders, which the other rules cover)."""
    path = _modules()[name]
    folder = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return folder if folder != "trainer" else None


def _folder_graph() -> dict[str, set[str]]:
    """Folder of `trainer/` -> the other folders its modules import."""
    graph: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        if _is_under(name, "trainer") and (folder := _folder(name)) is not None:
            graph.setdefault(folder, set()).update(
                _folder(t) for t in targets if _is_under(t, "trainer") and _folder(t) not in (None, folder))
    return graph


def _families() -> list[str]:
    return sorted(f"{REGISTRY}.{path.parent.name}" for path in (ROOT / "trainer" / "models").glob("*/__init__.py"))


def _is_core(name: str) -> bool:
    return _is_under(name, "trainer") and not _is_under(name, REGISTRY) and not any(
        name == entry if entry in ("trainer", "trainer.train") else _is_under(name, entry) for entry in TRAINER_ENTRIES)


def test_no_two_folders_of_the_trainer_import_each_other():
    cycle = _cycle(_folder_graph())
    assert cycle is None, "folders import each other: " + " -> ".join(cycle)


def _reached(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every module that importing ``name`` imports, itself included."""
    seen, todo = {name}, [name]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_core_never_imports_the_registry_or_a_family_even_through_another_module():
    graph = _graph()
    broken = []
    for name in sorted(n for n in graph if _is_core(n)):
        for target in sorted(graph[name]):
            registry = sorted(t for t in _reached(graph, target) if _is_under(t, REGISTRY))
            if registry:
                broken.append(f"{_modules()[name].relative_to(ROOT)} imports {target}"
                              + ("" if target == registry[0] else f", which imports {registry[0]}"))
    assert not broken, "\n".join(broken)


def test_no_module_outside_the_models_folder_imports_a_family():
    families = _families()
    assert {"trainer.models.gpt", "trainer.models.t5", "trainer.models.bert"} <= set(families)
    broken = [f"{path.relative_to(ROOT)} imports {target}" for name, path in _modules().items()
              if not _is_under(name, REGISTRY)
              for target in sorted(_imported(name, path)) if any(_is_under(target, f) for f in families)]
    assert not broken, "\n".join(broken)


def test_the_folder_checks_see_a_two_way_import():
    assert _cycle({"trainer.checkpoint": {"trainer.models"}, "trainer.models": {"trainer.checkpoint"}}) is not None
    assert _folder("trainer.parallel.dims") == "trainer.parallel" and _folder("trainer.config") is None
    assert _folder("trainer.models.gpt") == "trainer.models.gpt" and _folder("trainer.models") == "trainer.models"
    assert _is_core("trainer.parallel.dims") and _is_core("trainer.config")
    assert not _is_core("trainer.cli.train") and not _is_core("trainer.models.gpt.spec") and not _is_core("trainer.train")


# No module outside `trainer/models/` names a family in code: no string equal to a family's name (compared,
# a key, a value), no class named for a family, no import of a module named for one (`preprocess.tokenizers.t5`).
# Docstrings, messages and help text that mention a family (``"--fused-qkv applies to model gpt only"``) are prose.
# The exceptions, each with its reason: (module, what is named).
NAMING_EXCEPTIONS = {
    # `--model`'s default: a config built in Python (`TrainConfig()`) is a GPT run, as Megatron's pretrain_gpt.py.
    ("trainer.config", "default 'gpt'"),
    # `inspect --model`'s default: the sample kinds are `samplers.view.SAMPLE_KINDS`' (the data's layout), not
    # the trainer's families.
    ("trainer.cli.inspect", "default 'gpt'"),
}


def _family_names() -> set[str]:
    return {family.rpartition(".")[2] for family in _families()}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings or bare string statements (prose)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _names_of_families(path: Path, families: set[str]) -> list[str]:
    """What ``path``'s code names of a family (``'t5'``, ``class T5Config``, ``import preprocess.tokenizers.t5``),
    with the line of each."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    defaults = {id(node.value) for node in ast.walk(tree) if isinstance(node, (ast.AnnAssign, ast.keyword))
                and (isinstance(node, ast.AnnAssign) or node.arg == "default")}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                and node.value.lower() in families):
            found.append((node.lineno, ("default " if id(node) in defaults else "") + repr(node.value)))
        elif isinstance(node, ast.ClassDef) and any(node.name.lower().startswith(f) for f in families):
            found.append((node.lineno, f"class {node.name}"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names])
            found += [(node.lineno, f"import {m}") for m in modules if set(m.split(".")) & families]
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_no_module_outside_the_models_folder_names_a_family():
    families = _family_names()
    assert families >= {"gpt", "t5", "bert"}
    broken = [f"{path.relative_to(ROOT)}:{where}" for name, path in _modules().items()
              if _is_under(name, "trainer") and not _is_under(name, REGISTRY)
              for where in _names_of_families(path, families)
              if (name, where.partition(": ")[2]) not in NAMING_EXCEPTIONS]
    assert not broken, f"{len(broken)} names of a family outside trainer/models/:\n" + "\n".join(broken)


def test_the_naming_check_sees_a_comparison_a_class_and_an_import(tmp_path):
    module = tmp_path / "core.py"
    module.write_text('"""Docstring naming t5."""\nimport preprocess.tokenizers.t5\n\n\nclass BertConfig:\n'
                      '    """bert"""\n\n\ndef f(model="bert"):\n    return model == "t5" or model in ("gpt",)\n')
    assert _names_of_families(module, {"gpt", "t5", "bert"}) == [
        "2: import preprocess.tokenizers.t5", "5: class BertConfig", "9: 'bert'", "10: 'gpt'", "10: 't5'"]
