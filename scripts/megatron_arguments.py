"""Extract every command-line option string Megatron-LM's ``megatron/training/arguments.py`` defines.

Usage: ``python scripts/megatron_arguments.py GIT_DIR [COMMIT] > app/core/data/megatron_arguments.txt``
where GIT_DIR is a clone (or bare mirror) of NVIDIA/Megatron-LM. Nothing is imported or executed:
the source is read with :mod:`ast`.

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


def _fields(git_dir: str, commit: str, name: str, cache: dict[str, ast.Module]) -> dict[str, list[str]]:
    """field name -> option strings, base classes first (a subclass field overrides)."""
    cls = _class(git_dir, commit, name, cache)
    out: dict[str, list[str]] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id not in ("object",):
            out.update(_fields(git_dir, commit, base.id, cache))
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(node.annotation):
            continue
        field_name, default, names = node.target.id, node.value, None
        if isinstance(default, ast.Call) and ast.unparse(default.func).endswith("field"):
            kw = {k.arg: k.value for k in default.keywords}
            if _literal(kw.get("init"), {}) is False:
                continue
            meta = _literal(kw.get("metadata"), {})
            if isinstance(meta, dict) and isinstance(meta.get("argparse_meta"), dict):
                names = meta["argparse_meta"].get("arg_names")
            default = kw.get("default")
        if names is None:
            flag = field_name.replace("_", "-")
            is_false = isinstance(default, ast.Constant) and default.value is False
            names = [f"--{flag}"] if not _is_bool(node.annotation) or is_false else [f"--no-{flag}", f"--disable-{flag}"]
        out[field_name] = list(names)
    return out


def option_strings(git_dir: str, commit: str) -> list[str]:
    tree = ast.parse(show(git_dir, commit, ARGS))
    options: set[str] = set()
    cache: dict[str, ast.Module] = {}
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        assigned = {t.id: n.value for n in ast.walk(func) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            fname = ast.unparse(call.func)
            if fname.endswith("add_argument"):
                options.update(a.value for a in call.args
                               if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"))
            elif fname == "ArgumentGroupFactory" and call.args and isinstance(call.args[0], ast.Name):
                kw = {k.arg: k.value for k in call.keywords}
                exclude = set(_literal(kw.get("exclude"), assigned) or ())
                for field_name, names in _fields(git_dir, commit, call.args[0].id, cache).items():
                    if field_name not in exclude:
                        options.update(names)
    return sorted(options)


def main(argv: list[str]) -> None:
    git_dir = argv[1]
    commit = argv[2] if len(argv) > 2 else subprocess.run(
        ["git", "--git-dir", git_dir, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    opts = option_strings(git_dir, commit)
    print(f"# NVIDIA/Megatron-LM option strings at commit {commit}")
    print(f"# from {ARGS} (add_argument literals and ArgumentGroupFactory dataclass groups),")
    print("# extracted by scripts/megatron_arguments.py; one option string per line")
    print("\n".join(opts))


if __name__ == "__main__":
    main(sys.argv)
