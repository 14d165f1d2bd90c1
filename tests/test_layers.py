"""The package's layers, read from every import (function bodies included): core at the bottom,
then the device layer, then the model, then the application's folders by role (the files it reads
and writes with the tokenizers, then the run, then the commands, then the Python API and the
package's face); the reference beside them, judging.

Rules: no module imports a higher layer; no import cycle between modules; runtime code never
imports the reference (the tuner, the numerics check and the start check excepted: they check kernels against
it before trusting them); the reference imports only core; every import of the package's own
modules stands at the top of its module, where a reader sees the edge. The last test builds a package that breaks each rule and sees each
check fail on it."""
import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "tinygpt"
# the tokenizers beside the files: a file names its tokenizer, a tokenizer reads a vocabulary file
LAYERS = {"core": 0, "device": 1, "model": 2, "tokenizers": 3, "files": 3, "run": 4, "commands": 5}
APP = 6                 # anything else in tinygpt/: the API, the package's face, the browser's step
JUDGE_USERS = {"tinygpt.device.tune", "tinygpt.device.numerics", "tinygpt.model.twincheck"}


def module_name(pkg: Path, path: Path) -> str:
    parts = (pkg.name,) + path.relative_to(pkg).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(pkg: Path, name: str) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (pkg / rel).with_suffix(".py").exists() or (pkg / rel / "__init__.py").exists()


def imports(pkg: Path, path: Path):
    """[(imported module of the package, line, at module level)] of one file."""
    name = module_name(pkg, path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == pkg.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == pkg.name:
                mod = node.module
            else:
                continue
            targets = [f"{mod}.{a.name}" if is_module(pkg, f"{mod}.{a.name}") else mod for a in node.names]
        else:
            continue
        out += [(t, node.lineno, id(node) in top) for t in dict.fromkeys(targets)]
    return out


def layer(name: str):
    parts = name.split(".")
    if len(parts) > 1 and parts[1] == "reference":
        return "reference"
    return LAYERS.get(parts[1], APP) if len(parts) > 1 else APP


def graph(pkg: Path) -> dict:
    return {module_name(pkg, p): (p, imports(pkg, p)) for p in sorted(pkg.rglob("*.py"))}


def layer_violations(pkg: Path) -> list:
    bad = []
    for name, (path, imps) in graph(pkg).items():
        mine, where = layer(name), path.relative_to(pkg.parent)
        for target, line, _ in imps:
            theirs = layer(target)
            if mine == "reference":
                if theirs not in (0, "reference"):
                    bad.append(f"{where}:{line}: the reference imports {target}")
            elif theirs == "reference":
                if name not in JUDGE_USERS:
                    bad.append(f"{where}:{line}: runtime code imports the reference ({target})")
            elif theirs > mine:
                bad.append(f"{where}:{line}: layer {mine} imports {target} (layer {theirs})")
    return bad


def cycles(pkg: Path) -> list:
    g = {name: sorted({t for t, _, _ in imps if t != name}) for name, (_, imps) in graph(pkg).items()}
    state, stack, found = {}, [], []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in g.get(n, ()):
            if state.get(m) == "open":
                found.append(" -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"
    for n in g:
        if n not in state:
            visit(n)
    return found


def hidden_imports(pkg: Path) -> list:
    return [f"{path.relative_to(pkg.parent)}:{line}: {target}" for name, (path, imps) in graph(pkg).items()
            for target, line, top in imps if not top]


def test_the_graph_is_read():
    g = graph(PKG)
    edges = sum(len(i) for _, i in g.values())
    print(f"{len(g)} modules, {edges} imports of the package's own modules")
    assert {"tinygpt.model.gpt", "tinygpt.device.kernels", "tinygpt.commands.cli", "tinygpt.reference.gpt"} <= set(g)
    assert "tinygpt.device.kernels" in {t for t, _, _ in g["tinygpt.model.gpt"][1]}
    assert layer("tinygpt.core.config") == 0 and layer("tinygpt.model.gpt") == 2 and layer("tinygpt.commands.cli") == 5 \
        and layer("tinygpt.run.train") == 4 and layer("tinygpt.files.checkpoint") == 3 and layer("tinygpt.api") == APP


def test_no_module_imports_a_higher_layer():
    bad = layer_violations(PKG)
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = cycles(PKG)
    assert not found, "import cycles: " + "; ".join(found)


def test_the_package_imports_its_own_modules_at_the_top():
    hidden = hidden_imports(PKG)
    assert not hidden, "imports inside functions hide the layers' edges:\n" + "\n".join(hidden)


WIDTH = 120     # characters a line of the package and the scripts, the width wide Python projects allow


def long_lines(paths) -> list:
    return [f"{f.relative_to(PKG.parent)}:{n}: {len(line)} characters" for f in paths
            for n, line in enumerate(f.read_text().splitlines(), 1) if len(line) > WIDTH]


def test_lines_keep_to_the_width():
    files = sorted(PKG.rglob("*.py")) + sorted((PKG.parent / "scripts").glob("*.py"))
    found = long_lines(files)
    print(f"{len(files)} files, {len(found)} lines over {WIDTH} characters")
    assert len(files) > 40 and not found, "\n".join(found)


def test_the_checks_fail_on_a_package_that_breaks_each_rule(tmp_path):
    pkg = tmp_path / "tinygpt"
    for d in ("core", "device", "model", "reference"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from ..model import m\n")              # a lower layer reaching up
    (pkg / "model" / "m.py").write_text("from ..reference import r\n")          # runtime code using the judge
    (pkg / "reference" / "r.py").write_text("from ..device import d\n")         # the judge using the runtime
    (pkg / "device" / "d.py").write_text("")
    (pkg / "app.py").write_text("def f():\n    from . import cyc\n")           # hidden, and a cycle
    (pkg / "cyc.py").write_text("import tinygpt.app\n")
    bad = layer_violations(pkg)
    print("\n".join(bad))
    assert any("layer 0 imports tinygpt.model.m" in b for b in bad)
    assert any("runtime code imports the reference" in b for b in bad)
    assert any("the reference imports tinygpt.device.d" in b for b in bad)
    assert cycles(pkg) == ["tinygpt.app -> tinygpt.cyc -> tinygpt.app"]
    assert hidden_imports(pkg) == ["tinygpt/app.py:2: tinygpt.cyc"]


def name_comparisons(pkg: Path, names, *rooms: str) -> list:
    """Where a module outside the `rooms` (folders or files of the package) compares something with
    one of `names`: `x == "adamw"`, `x in ("adamw", "muon")`, a match case. Docstrings and help
    text that mention a name are not comparisons."""
    found = []
    lit = lambda n: isinstance(n, ast.Constant) and n.value in names
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if any(rel.parts[:len(Path(room).parts)] == Path(room).parts for room in rooms):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            sides = []
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                sides += [e for s in node.comparators if isinstance(s, (ast.Tuple, ast.List, ast.Set)) for e in s.elts]
            elif isinstance(node, ast.MatchValue):
                sides = [node.value]
            found += [f"tinygpt/{rel}:{node.lineno}: {s.value!r}" for s in sides if lit(s)]
    return found


def test_no_module_outside_the_optimizers_room_compares_their_names():
    """Issue 48: an optimizer is asked what it is (its room's class and settings), never compared
    by name outside model/optimizers/."""
    from tinygpt.model.optimizers import NAMES
    found = name_comparisons(PKG, set(NAMES), "model/optimizers")
    print(f"{len(found)} comparisons of {', '.join(NAMES)} outside model/optimizers/")
    assert not found, "\n".join(found)


def test_no_module_outside_the_tokenizers_room_compares_their_names():
    """Issue 48: a tokenizer is asked what it is (its vocabulary, its source, whether a token is a
    byte, its files), never compared by name outside tinygpt/tokenizers/."""
    from tinygpt.tokenizers import NAMES
    found = name_comparisons(PKG, set(NAMES), "tokenizers")
    print(f"{len(found)} comparisons of {', '.join(NAMES)} outside tokenizers/")
    assert not found, "\n".join(found)


def test_no_module_outside_the_precisions_rooms_compares_their_names():
    """Issue 48: a precision is asked what it is (core/precision.py's Precision: what it stores, its
    weight copy, its feature), and a stored type likewise (device/gpu.py's DType: packed, its
    products, its files; device/kernels.py's MATMULS: its fast matmuls), never compared by name.
    The float64 reference rounds by name, as its twins are named; checkpoint.py's "fp32" and
    "fp16" are values of the .tinygpt file's weightDtype field, not precisions."""
    from tinygpt.core.precision import PRECISIONS
    from tinygpt.device.gpu import DTYPES
    names = set(PRECISIONS) | {n for n, d in DTYPES.items() if d.packed} | {"f32"}
    found = name_comparisons(PKG, names, "core/precision.py", "device/gpu.py", "reference", "files/checkpoint.py")
    print(f"{len(found)} comparisons of {', '.join(sorted(names))} outside their rooms")
    assert not found, "\n".join(found)


def test_no_module_outside_the_blocks_rooms_compares_part_names():
    """Issue 66: a block part (norm, position, MLP, bias) is asked what it is (core/block.py's parts:
    rms, table, rotary, gated, its GPT-2 name, UPSTREAM_MLP), and an attention path likewise
    (model/attention.py: keeps_weights, reads, plainest, inspection), never compared by name."""
    from tinygpt.core.block import BIASES, MLPS, NORMS, POSITIONS
    from tinygpt.model.attention import PATHS
    names = set(MLPS) | set(NORMS) | set(POSITIONS) | set(BIASES) | set(PATHS)
    found = name_comparisons(PKG, names, "core/block.py", "model/attention.py")
    print(f"{len(found)} comparisons of {', '.join(sorted(names))} outside core/block.py and model/attention.py")
    assert not found, "\n".join(found)


def test_the_name_check_sees_a_comparison(tmp_path):
    pkg = tmp_path / "tinygpt"
    (pkg / "model" / "optimizers").mkdir(parents=True)
    (pkg / "model" / "optimizers" / "a.py").write_text('ok = name == "adamw"\n')
    (pkg / "train.py").write_text('"""adamw is named here, compared nowhere"""\nif s.name in ("adamw", "muon"):\n'
                                  '    pass\nmatch s.name:\n    case "lion":\n        pass\n')
    found = name_comparisons(pkg, {"adamw", "muon", "lion"}, "model/optimizers")
    print(found)
    assert found == ["tinygpt/train.py:2: 'adamw'", "tinygpt/train.py:2: 'muon'", "tinygpt/train.py:5: 'lion'"]


def test_every_package_folder_ships():
    """pyproject.toml lists the packages a wheel holds: a new folder of the package missing there
    works from this checkout (an editable install finds it) and is absent from an installed copy."""
    try:
        import tomllib
    except ImportError:             # Python 3.10: the package's own dependency
        import tomli as tomllib
    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(PKG, p) for p in PKG.rglob("__init__.py")}
    print(f"{len(folders)} package folders, {len(listed)} listed")
    assert folders <= listed, f"not in pyproject.toml's packages: {sorted(folders - listed)}"


LONGEST = 60    # lines a function of the package may take (issue 48): longer ones were split by what they do


def long_functions(paths) -> list:
    out = []
    for f in paths:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > LONGEST:
                out.append(f"{f.relative_to(PKG.parent)}:{n.lineno}: {n.name}, {n.end_lineno - n.lineno + 1} lines")
    return out


def test_no_function_is_longer_than_sixty_lines():
    files = sorted(PKG.rglob("*.py"))
    found = long_functions(files)
    longest = max(n.end_lineno - n.lineno + 1 for f in files for n in ast.walk(ast.parse(f.read_text()))
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    print(f"the longest function of the package: {longest} lines")
    assert not found, "\n".join(found)


SHADERS = PKG.parent / "shaders"
MOST_SHADER_FILES = 25     # issue 48: one source per op family, not one per dtype or width
SHARED_RUN = 6             # lines two files may not share


def shared_runs(files, run=SHARED_RUN) -> list:
    """'a ~ b: line' for each pair of files sharing `run` consecutive lines of code, identical but
    for indentation (blank lines, comments and lone braces do not count, nor break a run)."""
    def code(f):
        lines = [(n, l.split("//")[0].strip()) for n, l in enumerate(f.read_text().splitlines(), 1)]
        return [(n, l) for n, l in lines if l and l not in ("}", "{", "} else {")]
    seen, out = {}, []
    for f in files:
        c = code(f)
        for i in range(len(c) - run + 1):
            key = tuple(l for _, l in c[i:i + run])
            first = seen.setdefault(key, (f, c[i][0]))
            if first[0] != f and not any(o.startswith(f"{first[0].name} ~ {f.name}") for o in out):
                out.append(f"{first[0].name} ~ {f.name}: lines {first[1]} and {c[i][0]}")
    return out


def test_one_shader_source_per_op_family():
    files = sorted(SHADERS.glob("*.wgsl"))
    print(f"{len(files)} shader files (at most {MOST_SHADER_FILES})")
    assert len(files) <= MOST_SHADER_FILES, [f.name for f in files]
    found = shared_runs(files)
    assert not found, "copies across shader files (a width or dtype is a Fill, not a file): " + "; ".join(found)


def test_the_shader_copy_check_sees_a_copy(tmp_path):
    body = "".join(f"  let x{i} = a[{i}u] * {i}.0;\n" for i in range(SHARED_RUN))
    (tmp_path / "a.wgsl").write_text(f"fn f() {{\n{body}}}\n")
    (tmp_path / "b.wgsl").write_text(f"// a copy\nfn g() {{\n\n{body}}}\n")
    assert shared_runs(sorted(tmp_path.glob("*.wgsl"))) == ["a.wgsl ~ b.wgsl: lines 2 and 4"]
    (tmp_path / "b.wgsl").write_text(f"fn g() {{\n{body.replace('3.0', '3.5')}}}\n")
    assert shared_runs(sorted(tmp_path.glob("*.wgsl"))) == []


def two_meanings(pkg: Path) -> list:
    """Where the package spells a name that issue 48 gave one meaning each: a class named `Path`
    (pathlib's; attention's is `AttentionPath`), anything called spec(s) but a `RunSpec` (a
    parameter list is `*_shapes`), a `*_path` that is not a file's (the decoder's is its `mode`),
    and a module named gate (the numerics check is `numerics`; `Gate` is the clip and scaler)."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent)
        if path.stem == "gate":
            found.append(f"{rel}: a module named gate")
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ClassDef) and node.name == "Path":
                found.append(f"{rel}:{node.lineno}: class Path")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, ast.Name):
                names.append(node.id)
            elif isinstance(node, ast.Attribute):
                names.append(node.attr)
            elif isinstance(node, ast.arg):
                names.append(node.arg)
            found += [f"{rel}:{node.lineno}: {n}" for n in names if n == "specs" or n.endswith("_specs")
                      or n in ("decode_path",)]
    return found


def test_names_keep_one_meaning():
    found = two_meanings(PKG)
    print(f"{len(found)} names of two meanings")
    assert not found, "\n".join(found)


def test_the_meaning_check_sees_a_second_meaning(tmp_path):
    pkg = tmp_path / "tinygpt"
    pkg.mkdir()
    (pkg / "gate.py").write_text("class Path:\n    pass\n\ndef f(specs):\n    return decode_path(specs)\n")
    found = two_meanings(pkg)
    print(found)
    assert len(found) == 5


# issue 48's bounds on the house, kept by tests (deliver 7): the command line and the loop stay
# small, and Model is composed of its parts, not read from outside
MOST_LINES = {"commands/cli.py": 450, "run/train.py": 450}
MOST_MODEL_METHODS = 25
MOST_MODEL_ATTRIBUTES = 25    # #66: the model composes its parts rather than holding their pieces


def test_the_command_line_and_the_loop_stay_small():
    sizes = {name: len((PKG / name).read_text().splitlines()) for name in MOST_LINES}
    print(", ".join(f"{name} {n} lines (at most {MOST_LINES[name]})" for name, n in sizes.items()))
    assert all(n <= MOST_LINES[name] for name, n in sizes.items()), sizes


# the one builder of every command's flags (#66: one schema for every setting)
FLAG_BUILDERS = {("commands/settings.py", "add_setting"), ("commands/settings.py", "add_flags")}


def flag_calls(files, root) -> list:
    """Every add_argument call in files, as (file, the function that makes it, line), outside the
    builders."""
    found = []
    for f in files:
        tree = ast.parse(f.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            name = getattr(fn, "name", "<module>")
            body = ast.walk(fn) if isinstance(fn, ast.FunctionDef) else \
                [n for stmt in fn.body if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(stmt)]
            for n in body:
                if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "add_argument" \
                        and (f.relative_to(root).as_posix(), name) not in FLAG_BUILDERS:
                    found.append((f.relative_to(root).as_posix(), name, n.lineno))
    return sorted(set(found))


def test_every_flag_is_made_by_the_schemas_builder_and_the_api_parses_no_command_line():
    """Each command's flags are values (its table in cli.py, chat.py; train's the recipe's fields),
    built by settings.add_flags alone; the Python API checks its keywords from the same fields
    without argparse."""
    found = flag_calls(sorted(PKG.rglob("*.py")), PKG)
    api_imports = {a.name for n in ast.walk(ast.parse((PKG / "api.py").read_text()))
                   if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names} | \
        {n.module for n in ast.walk(ast.parse((PKG / "api.py").read_text())) if isinstance(n, ast.ImportFrom)}
    print(f"add_argument outside the builder: {found}; api.py's imports of argparse: "
          f"{sorted(m for m in api_imports if m and 'argparse' in m)}")
    assert not found and not any(m and "argparse" in m for m in api_imports), found


def test_the_flag_check_sees_a_hand_made_flag(tmp_path):
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "cli.py").write_text("def f(p):\n    p.add_argument('--x')\n")
    (tmp_path / "commands" / "settings.py").write_text("def add_flags(p, fs):\n    p.add_argument('--y')\n")
    assert flag_calls(sorted(tmp_path.rglob("*.py")), tmp_path) == [("commands/cli.py", "f", 2)]


MOST_KERNELS_METHODS = 40    # #66: the launchers of each other shader family are a Family of their own


def test_the_launchers_are_families():
    """Kernels holds its own launchers (products, casts, elementwise ops and activations, norms, the
    gated MLP's, the heads' and the tables') and one Family object per other shader family; no
    class of launchers grows past MOST_KERNELS_METHODS."""
    tree = ast.parse((PKG / "device" / "kernels.py").read_text())
    classes = {c.name: [n.name for n in c.body if isinstance(n, ast.FunctionDef)]
               for c in tree.body if isinstance(c, ast.ClassDef)}
    families = [c.name for c in tree.body if isinstance(c, ast.ClassDef)
                and any(getattr(b, "id", None) == "Family" for b in c.bases)]
    sizes = {name: len(classes[name]) for name in ["Kernels"] + families}
    print("methods:", sizes)
    assert len(families) >= 5 and all(n <= MOST_KERNELS_METHODS for n in sizes.values()), sizes


def model_privates(src: str) -> tuple[list, set, set]:
    """(the methods of class Model, the private names it gives itself (self._x), and every
    attribute it sets on itself)."""
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "Model")
    methods = [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    on_self = [n for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "self"]
    private = {n.attr for n in on_self if n.attr.startswith("_") and not n.attr.startswith("__")}
    attributes = {n.attr for n in on_self if isinstance(n.ctx, ast.Store)}
    return methods, private, attributes


def private_reads(files, private: set) -> list:
    return [f"{f.name}:{n}: .{name}" for f in files
            for n, line in enumerate(f.read_text().splitlines(), 1) for name in private
            if re.search(r"\.%s\b" % re.escape(name), line)]


def test_model_is_small_and_no_module_reads_its_private_names():
    """The Model composes its parts (its layout, buffers, recorded graph, attention and head) and
    holds few names of its own; the recorder and everything else read those parts, never a
    private name of the model."""
    methods, private, attributes = model_privates((PKG / "model" / "gpt.py").read_text())
    outside = [f for f in sorted(PKG.rglob("*.py")) if f.name != "gpt.py"]
    found = private_reads(outside, private)
    print(f"Model: {len(methods)} methods (at most {MOST_MODEL_METHODS}), {len(attributes)} attributes (at most "
          f"{MOST_MODEL_ATTRIBUTES}), {len(private)} private names, {len(found)} read outside gpt.py")
    assert len(methods) <= MOST_MODEL_METHODS and len(attributes) <= MOST_MODEL_ATTRIBUTES, (methods, attributes)
    assert private and not found, found


def test_the_private_read_check_sees_a_read(tmp_path):
    methods, private, attributes = model_privates("class Model:\n    def f(self):\n        self._fwd = 1\n")
    (tmp_path / "api.py").write_text("x = model._fwd\ny = model.fwd\n")
    assert methods == ["f"] and private == attributes == {"_fwd"}
    assert [r.endswith(":1: ._fwd") for r in private_reads([tmp_path / "api.py"], private)] == [True]


# The tests mirror the rooms: tests/ROOM/ for each room of the package (tinygpt/ROOM) or of the checkout
# (scripts/), at the top the house's own rules and what serves every room (conftest.py's fixtures,
# support.py, upstream.py). A test imports another test module of its own room only: a helper two
# rooms use lives at the top, so that any one room's tests run alone.
HOUSE_TESTS = {"test_layers.py", "test_docs.py", "test_promises.py", "test_api.py"}


def layout_problems(tests: Path, pkg: Path) -> list:
    """What breaks the tests' layout: a folder no room of the package's or the checkout's, a test file
    of a room at the top, a test importing a test module of another room."""
    rooms = {d.name for d in pkg.iterdir() if (d / "__init__.py").exists()} | {"scripts"}
    bad = [f"tests/{d.name}/ is no room of tinygpt/ or the checkout" for d in tests.iterdir()
           if d.is_dir() and not d.name.startswith((".", "__")) and d.name not in rooms]
    bad += [f"tests/{f.name} belongs in a room's folder" for f in tests.glob("test_*.py") if f.name not in HOUSE_TESTS]
    for f in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{f.relative_to(tests)} imports {n}, a test of another room" for n in names
                    if n.startswith("test_") and not (f.parent / f"{n}.py").exists()]
    return bad


def test_the_tests_mirror_the_rooms():
    tests = PKG.parent / "tests"
    rooms = sorted(d.name for d in tests.iterdir() if d.is_dir() and not d.name.startswith((".", "__")))
    print(f"rooms: {rooms}; {len(list(tests.glob('*/test_*.py')))} test files in them, "
          f"{len(list(tests.glob('test_*.py')))} at the top")
    assert not layout_problems(tests, PKG)


def test_the_room_check_sees_a_stray(tmp_path):
    (tmp_path / "tinygpt" / "model").mkdir(parents=True)
    (tmp_path / "tinygpt" / "model" / "__init__.py").write_text("")
    (tmp_path / "tests" / "model").mkdir(parents=True)
    (tmp_path / "tests" / "model" / "test_a.py").write_text("from test_b import x\n")
    (tmp_path / "tests" / "nowhere").mkdir()
    (tmp_path / "tests" / "test_c.py").write_text("")
    found = layout_problems(tmp_path / "tests", tmp_path / "tinygpt")
    assert len(found) == 3, found
