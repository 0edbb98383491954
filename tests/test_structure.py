"""The shape of the code: imports go one way, no cycles, and `import keras_attn` on JAX or
torch does not import TensorFlow.

These are structural checks on purpose: the structure is the feature (DESIGN.md's layering).
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "keras_attn"

# Lower ranks never import higher ones; modules of one rank import only within their group.
RANKS = {
    "keras_attn._checks": 0,
    "keras_attn._traced": 0,
    "keras_attn.tokens": 0,
    "keras_attn.tuning": 1,
    "keras_attn.ops": 2,
    "keras_attn.data": 2,
    "keras_attn.metrics": 2,
    "keras_attn.viz": 2,
    "keras_attn.layers": 3,
    "keras_attn.models": 4,
    "keras_attn.decoding": 5,
    "keras_attn.checkpoints": 5,  # pretrained weights in: reads models (phase 2), never the reverse
    "keras_attn.preprocessing": 6,  # tokenizers as layers (checkpoint tokenizers wrapped)
    "keras_attn.export": 7,
    "keras_attn.export_generator": 7,
    "keras_attn.export_formats": 7,
    "keras_attn.export_decoding": 7,
    "keras_attn.export_steps": 7,  # NumPy + onnxruntime / LiteRT only: copied beside a service
    "keras_attn.distribute": 7,
    "keras_attn.tasks": 8,  # models used whole: backbone + preprocessor + sampler, on top
    # Code that serves the examples and benchmarks (tiny checkpoints, the translation recipe):
    # it may import all of the library; nothing in the library imports it.
    "keras_attn.recipes": 9,
}


# The imports against the layering, each at use only: `keras_attn.layers.__getattr__` forwards
# the stacks that moved to `keras_attn.models` (deprecated names), and
# `keras_attn.models.__getattr__` the task models (`keras_attn.models.CausalLM`, as the issue
# and keras-hub spell it) from `keras_attn.tasks`.
ALLOWED = {("keras_attn.layers", "keras_attn.models"), ("keras_attn.models", "keras_attn.tasks")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group(name: str) -> str:
    matches = [prefix for prefix in RANKS if name == prefix or name.startswith(prefix + ".")]
    assert matches, f"{name} has no place in the layering; add it to RANKS"
    return max(matches, key=len)


def imports(path: Path) -> set[str]:
    """Every keras_attn module `path` imports, at module level or inside functions
    (`from package import submodule` counts as the submodule)."""
    modules, found = all_modules(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("keras_attn"))
        elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
              and node.module.startswith("keras_attn")):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def all_modules():
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def resolve(name: str, modules) -> str:
    """`name` if it is a module, else the module it is an attribute of."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_imports_go_one_way():
    modules = all_modules()
    wrong = []
    for name, path in modules.items():
        if name == "keras_attn":
            continue  # the package's front door imports everything
        source = group(name)
        for target in imports(path):
            target_group = group(resolve(target, modules))
            if (name, resolve(target, modules)) in ALLOWED:
                continue
            if RANKS[target_group] > RANKS[source] or (
                    RANKS[target_group] == RANKS[source] and target_group != source):
                wrong.append(f"{name} ({source}) imports {target} ({target_group})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _imports_models(node) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module and n.module.startswith(
        "keras_attn.models") or isinstance(n, ast.ImportFrom) and n.module == "keras_attn"
        and any(a.name == "models" for a in n.names) or isinstance(n, ast.Import) and any(
        a.name.startswith("keras_attn.models") for a in n.names) for n in ast.walk(node))


def test_the_one_allowed_forwarding_imports_models_lazily():
    """layers/ imports models/ only inside `keras_attn.layers.__getattr__`, never at module
    level and nowhere else."""
    tree = ast.parse((PACKAGE / "layers" / "__init__.py").read_text())
    forwarding = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name == "__getattr__"]
    assert len(forwarding) == 1 and _imports_models(forwarding[0])
    assert not any(_imports_models(n) for n in tree.body if n is not forwarding[0])
    others = [path for path in (PACKAGE / "layers").rglob("*.py")
              if path.name != "__init__.py" and _imports_models(ast.parse(path.read_text()))]
    assert not others


def test_no_import_cycles():
    modules = all_modules()
    graph = {name: {resolve(t, modules) for t in imports(path)} - {name}
             - {target for source, target in ALLOWED if source == name}
             for name, path in modules.items() if name != "keras_attn"}
    state: dict[str, int] = {}

    def visit(name, stack):
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if target == "keras_attn" or target not in graph:
                continue
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [name, target]))
            if not state.get(target):
                visit(target, stack + [name])
        state[name] = 2

    for name in sorted(graph):
        if not state.get(name):
            visit(name, [])


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_import_on_another_backend_does_not_import_tensorflow(backend):
    pytest.importorskip(backend)
    code = ("import sys, keras_attn, keras_attn.ops, keras_attn.layers, keras_attn.models, "
            "keras_attn.decoding, keras_attn.tuning; "
            "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules "
            "if m.startswith('tensorflow'))[:5]")
    env = dict(os.environ, KERAS_BACKEND=backend)
    result = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                            text=True, timeout=240, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr[-2000:]


TESTS = Path(__file__).resolve().parent
HELPER_MODULES = ("reference.py", "backend_utils.py", "layer_test_utils.py")


def _top_level_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef)}


def test_test_helpers_are_defined_once():
    """A test file imports the shared helpers (`reference`, `backend_utils`,
    `layer_test_utils`) instead of defining a function of the same name again."""
    shared = {name: module for module in HELPER_MODULES
              for name in _top_level_functions(TESTS / module) if not name.startswith("_")}
    again = [f"{path.name} defines {name} ({shared[name]} has it)"
             for path in sorted(TESTS.glob("test_*.py"))
             for name in sorted(_top_level_functions(path) & set(shared))]
    assert not again, "\n".join(again)


def _private_attribute_reads(path: Path) -> list[str]:
    """`x._name` read inside an `assert` of a test file (dunders and modules' own private
    hooks left aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assert):
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Attribute) and sub.attr.startswith("_")
                        and not sub.attr.startswith("__")):
                    found.append(f"{path.name}:{sub.lineno} .{sub.attr}")
    return found


def test_no_test_asserts_a_private_attribute():
    found = [hit for path in sorted(TESTS.glob("test_*.py"))
             for hit in _private_attribute_reads(path)]
    assert not found, "\n".join(found)


# Import names whose distribution is named otherwise.
DISTRIBUTIONS = {"tensorflow_text": "tensorflow-text", "keras_hub": "keras-hub",
                 "ml_dtypes": "ml-dtypes", "sklearn": "scikit-learn"}


def _requirements(extra: str) -> set[str]:
    """The distributions `pip install -e ".[extra]"` asks for (setup.cfg), by name."""
    import configparser
    import re

    config = configparser.ConfigParser()
    config.read(PACKAGE.parent / "setup.cfg")
    lines = (config["options"]["install_requires"] + "\n"
             + config["options.extras_require"][extra]).split("\n")
    return {re.split(r"[<>=!~;\[ ]", line.strip())[0].lower().replace("_", "-")
            for line in lines if line.strip()}


def test_the_checkpoints_extra_installs_what_the_checkpoints_import():
    """`pip install -e ".[checkpoints]"` must bring every library `keras_attn.checkpoints`
    imports (tensorflow-text for every tokenizer, safetensors, ...), not rely on another
    package happening to depend on it."""
    imported = set()
    for path in sorted((PACKAGE / "checkpoints").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and not node.level else [])
            imported |= {name.split(".")[0] for name in names}
    third_party = {name for name in imported - {"keras_attn", "__future__"}
                   if name not in sys.stdlib_module_names}
    assert {"tensorflow_text", "safetensors", "sentencepiece"} <= third_party
    declared = _requirements("checkpoints")
    missing = sorted(DISTRIBUTIONS.get(name, name).replace("_", "-") for name in third_party
                     if DISTRIBUTIONS.get(name, name).replace("_", "-") not in declared)
    assert not missing, missing
