"""Extract every command-line option string Megatron-LM's ``megatron/training/arguments.py`` defines.

Usage: ``python scripts/megatron_arguments.py GIT_DIR [COMMIT] > app/core/data/megatron_arguments.txt``
where GIT_DIR is a clone (or bare mirror) of NVIDIA/Megatron-LM. Nothing is imported or executed:
the source is read with :mod:`ast`. Each line is an option string and how argparse reads it (a
switch, or a value with its nargs, type and choices), so a test can rebuild Megatron's parser and
parse an export exactly as ``parse_args`` would.

Two sources of options, as Megatron builds its parser:

* literal strings starting with ``-`` passed to ``add_argument(...)`` in ``arguments.py``;
* ``ArgumentGroupFactory(ConfigClass, exclude=[...])`` groups
  (``megatron/training/argument_utils.py``): one option per dataclass field (base classes
  included) not in ``exclude`` and not ``init=False``, named ``--field-name``; a ``bool`` /
  ``Optional[bool]`` field whose default is not ``False`` becomes ``--no-field-name`` and
  ``--disable-field-name`` (store_false); ``metadata={"argparse_meta": {"arg_names": [...]}}``
  replaces the names.
"""

from __future__ import annotations

import ast
import subprocess
import sys

ARGS = "megatron/training/arguments.py"
CLASS_FILES = {
    "TransformerConfig": "megatron/core/transformer/transformer_config.py",
    "ModelParallelConfig": "megatron/core/model_parallel_config.py",
}
TRAINING_CONFIG = "megatron/training/config"   # a package: the class is searched in every module


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _literal(node: ast.AST | None, names: dict[str, ast.AST]) -> object:
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _is_bool(ann: ast.AST | None) -> bool:
    text = ast.unparse(ann) if ann is not None else ""
    return text in ("bool", "Optional[bool]", "bool | None", "typing.Optional[bool]")


def _class(git_dir: str, commit: str, name: str, cache: dict[str, ast.Module]) -> ast.ClassDef:
    if name in CLASS_FILES:
        paths = [CLASS_FILES[name]]
    else:
        listing = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit,
                                  TRAINING_CONFIG + "/"], check=True, capture_output=True, text=True).stdout
        paths = [p for p in listing.split() if p.endswith(".py")]
        found = subprocess.run(["git", "--git-dir", git_dir, "grep", "-l", "-E", f"^class {name}\\b", commit,
                                "--", "megatron"], check=False, capture_output=True, text=True).stdout
        paths += [line.split(":", 1)[1] for line in found.split()]   # re-exported classes
    for path in paths:
        if path not in cache:
            cache[path] = ast.parse(show(git_dir, commit, path))
        for node in cache[path].body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
    raise SystemExit(f"class {name} not found in {paths}")


#: How argparse reads an option: ``switch`` (store_true / store_false / store_const /
#: BooleanOptionalAction: no value) or ``value`` with its nargs (``1``, ``?``, ``+``, ``*``), value type
#: (``int``, ``float``, ``str``, or ``any`` for a custom parser) and choices (``-``: any).
Shape = tuple[str, str, str, str]
SWITCH: Shape = ("switch", "0", "-", "-")
_TYPES = {"int": "int", "float": "float", "str": "str"}


def _annotation_shape(ann: ast.AST | None) -> Shape:
    """The shape ``ArgumentGroupFactory._extract_type`` gives a dataclass annotation
    (``megatron/training/argument_utils.py``: Optional unwrapped, ``list[X]`` -> nargs '+', Literal ->
    choices, bool -> a switch)."""
    text = ast.unparse(ann) if ann is not None else ""
    for wrap in ("Optional[", "typing.Optional["):
        if text.startswith(wrap) and text.endswith("]"):
            text = text[len(wrap):-1]
    text = text.removesuffix(" | None")
    if text == "bool":
        return SWITCH
    nargs = "1"
    for wrap in ("list[", "List[", "typing.List["):
        if text.startswith(wrap) and text.endswith("]"):
            text, nargs = text[len(wrap):-1], "+"
    if text.startswith(("Literal[", "typing.Literal[")):
        try:
            values = ast.literal_eval(text[text.index("[") + 1:-1] + ",")
        except (ValueError, SyntaxError):
            return ("value", nargs, "any", "-")
        kind = "int" if all(isinstance(v, int) for v in values) else "str"
        return ("value", nargs, kind, ",".join(map(str, values)))
    return ("value", nargs, _TYPES.get(text, "any"), "-")


def _call_shape(kw: dict[str, ast.AST], names: dict[str, ast.AST], base: Shape | None = None) -> Shape:
    """The shape of ``add_argument(..., **kw)`` (or of argparse_meta overriding ``base``)."""
    action = kw.get("action")
    if action is not None:
        text = ast.unparse(action).strip("'\"")
        if text in ("store_true", "store_false", "store_const", "argparse.BooleanOptionalAction", "count"):
            return SWITCH
    _, nargs, typ, choices = base or ("value", "1", "str", "-")
    if "type" in kw:
        typ = _TYPES.get(ast.unparse(kw["type"]), "any")
    if "nargs" in kw:
        nargs = str(_literal(kw["nargs"], names))
    if "choices" in kw:
        found = _literal(kw["choices"], names)
        choices = ",".join(map(str, found)) if isinstance(found, (list, tuple)) else "-"
    return ("value", nargs, typ, choices)


def _meta(kw: dict[str, ast.AST]) -> dict[str, ast.AST] | None:
    """The ``argparse_meta`` dict of a ``field(metadata=...)`` as AST values (they may name types)."""
    meta = kw.get("metadata")
    if not isinstance(meta, ast.Dict):
        return None
    for k, v in zip(meta.keys, meta.values, strict=True):
        if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
            return {str(kk.value): vv for kk, vv in zip(v.keys, v.values, strict=True) if isinstance(kk, ast.Constant)}
    return None


def _fields(git_dir: str, commit: str, name: str, cache: dict[str, ast.Module]) -> dict[str, dict[str, Shape]]:
    """field name -> {option string: shape}, base classes first (a subclass field overrides)."""
    cls = _class(git_dir, commit, name, cache)
    out: dict[str, dict[str, Shape]] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id not in ("object",):
            out.update(_fields(git_dir, commit, base.id, cache))
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(node.annotation):
            continue
        field_name, default, names = node.target.id, node.value, None
        shape = _annotation_shape(node.annotation)
        if isinstance(default, ast.Call) and ast.unparse(default.func).endswith("field"):
            kw = {k.arg: k.value for k in default.keywords if k.arg}
            if _literal(kw.get("init"), {}) is False:
                continue
            meta = _meta(kw)
            if meta is not None:
                found = _literal(meta.get("arg_names"), {})
                names = list(found) if isinstance(found, (list, tuple)) else None
                shape = _call_shape(meta, {}, shape) if shape != SWITCH or "action" in meta else shape
            default = kw.get("default")
        if names is None:
            flag = field_name.replace("_", "-")
            is_false = isinstance(default, ast.Constant) and default.value is False
            names = [f"--{flag}"] if not _is_bool(node.annotation) or is_false else [f"--no-{flag}", f"--disable-{flag}"]
        out[field_name] = {n: shape for n in names}
    return out


def options(git_dir: str, commit: str) -> dict[str, Shape]:
    """Every option string of Megatron's parser -> how argparse reads it."""
    tree = ast.parse(show(git_dir, commit, ARGS))
    found: dict[str, Shape] = {}
    cache: dict[str, ast.Module] = {}
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        assigned = {t.id: n.value for n in ast.walk(func) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            fname = ast.unparse(call.func)
            if fname.endswith("add_argument"):
                shape = _call_shape({k.arg: k.value for k in call.keywords if k.arg}, assigned)
                for a in call.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"):
                        found[a.value] = shape
            elif fname == "ArgumentGroupFactory" and call.args and isinstance(call.args[0], ast.Name):
                kw = {k.arg: k.value for k in call.keywords}
                exclude = set(_literal(kw.get("exclude"), assigned) or ())
                for field_name, named in _fields(git_dir, commit, call.args[0].id, cache).items():
                    if field_name not in exclude:
                        found.update(named)
    return found


def option_strings(git_dir: str, commit: str) -> list[str]:
    return sorted(options(git_dir, commit))


def main(argv: list[str]) -> None:
    git_dir = argv[1]
    commit = argv[2] if len(argv) > 2 else subprocess.run(
        ["git", "--git-dir", git_dir, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    opts = options(git_dir, commit)
    print(f"# NVIDIA/Megatron-LM option strings at commit {commit}")
    print(f"# from {ARGS} (add_argument literals and ArgumentGroupFactory dataclass groups),")
    print("# extracted by scripts/megatron_arguments.py; one option string per line, then how argparse reads")
    print("# it, tab-separated: switch | value, nargs (0 1 ? + *), type (int float str any), choices (- : any)")
    print("\n".join("\t".join((flag, *opts[flag])) for flag in sorted(opts)))


if __name__ == "__main__":
    main(sys.argv)
