"""The flags kiln's compiler wrapper gives every compile so that its output does not
depend on where the tree, the build Python or the CUDA home lie (stdlib ``os`` and ``re``
only: it is all that nvcc's own host-compiler calls through the wrapper need, and those
are many, so they must not pay for the object cache's imports; see :func:`nested_main`).
"""

from __future__ import annotations

import os
import re
import sys
from types import ModuleType

# Run as .kiln/compileflags.py for each call nvcc makes of its host compiler: the kit's
# copy beside it, by plain name, never the kiln package (its import, some 24 ms, on
# every call: steps have kiln on PYTHONPATH)
if __package__:
    from kiln.inside.kit import contract
else:
    import contract  # type: ignore[no-redef]

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu")
CXX_SUFFIXES = (".cc", ".cpp", ".cxx")
# Set for everything a compile run through the wrapper starts (nvcc's -ccbin host compiler).
NESTED = contract.WRAPPED


# How the compiler wrapper (objcache.py) prints an error of its own (kiln.inside.diagnose
# reads it back; the arch rewrite has its own, archflags.PREFIX).
WRAPPER_PREFIX = "kiln compiler wrapper: error: "


def archflags() -> ModuleType:
    """The arch rewrite (``archflags.py``), imported only when it is asked for: most
    compiles never need it, and every compile would pay for its import."""
    try:
        from kiln.inside.kit import archflags as module
    except ImportError:  # a shipped tree's .kiln/: the kit's copy beside this one
        import archflags as module  # type: ignore[no-redef]
    return module


def env_roots() -> list[tuple[str, str]]:
    pairs = []
    raw = os.environ.get(contract.OBJCACHE_ROOTS, "")
    for item in raw.split(";"):
        name, _, path = item.partition("=")
        if name and path:
            pairs.append((name, os.path.realpath(path)))
    return sorted(pairs, key=lambda p: -len(p[1]))


PREFIX_TARGETS = {"TREE": ".", "SITE": "/site-packages", "CUDA": "/cuda"}


def is_nvcc(compiler: str) -> bool:
    return os.path.basename(compiler).startswith("nvcc")


PATH_FLAGS = ("-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-I")


def inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + os.sep)


def relative_paths(args: list[str], tree: str | None) -> list[str]:
    """Sources and include paths inside the tree, written relative to the working
    directory, as ccache's ``base_dir`` would run them: a compile then reads the same
    command with ccache or without (debug info names its source as given), and ccache
    finds nothing left to rewrite. Only where the working directory is in the tree
    (elsewhere the wrapper runs without ccache: :func:`_launcher`)."""
    cwd = os.path.realpath(os.getcwd())
    if not tree or not inside(cwd, tree):
        return args

    def rel(path: str) -> str:
        norm = os.path.normpath(path)
        return os.path.relpath(norm, cwd) if path.startswith("/") and inside(norm, tree) else path

    out: list[str] = []
    it = iter(args)
    for a in it:
        flag = next((f for f in PATH_FLAGS if a == f or a.startswith(f + "/")), None)
        if flag is not None and a == flag:
            out += [a, rel(next(it, ""))]
        elif flag is not None:
            out.append(flag + rel(a[len(flag) :]))
        elif a.startswith("/") and a.endswith(SOURCE_SUFFIXES) and os.path.isfile(a):
            out.append(rel(a))
        else:
            out.append(a)
    return out


_BUILD_LIB = re.compile(r"^lib\.[^/]+$")


def installed_dir(output: str) -> str | None:
    """Where a shared object setuptools links into ``build/lib.<platform>/`` lands,
    relative to site-packages once the wheel is installed (None: not such a link)."""
    parts = os.path.realpath(output).split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i - 1] == "build" and _BUILD_LIB.match(parts[i]):
            return os.path.join(*parts[i + 1 : -1]) if len(parts) > i + 2 else "."
    return None


def relocatable_rpaths(args: list[str], site: str | None) -> list[str]:
    """An ``-Wl,-rpath,<build venv's site-packages>/x`` (NVSHMEM's, NCCL's folder) made
    ``$ORIGIN``-relative: the wheel is installed into a site-packages beside the same
    NVIDIA wheels, and the build venv's path would make every build folder's bytes
    differ and point nowhere on the user's machine."""
    out = args[args.index("-o") + 1] if "-o" in args[:-1] else None
    where = installed_dir(out) if out else None
    if not site or where is None:
        return args

    def rel(path: str) -> str:
        real = os.path.realpath(path)
        if not inside(real, site):
            return path
        return "$ORIGIN/" + os.path.relpath(real, os.path.join(site, where))

    fixed = []
    for a in args:
        for prefix in ("-Wl,-rpath,", "-Wl,-rpath="):
            if a.startswith(prefix):
                a = prefix + ":".join(rel(p) for p in a[len(prefix) :].split(":"))
        fixed.append(a)
    return fixed


def deterministic_args(compiler: str, args: list[str], roots: list[tuple[str, str]]) -> list[str]:
    if os.environ.get(contract.DETERMINISTIC) == "0":
        return args
    nvcc = is_nvcc(compiler)
    flags = contract.Flags.from_env(os.environ)  # the recipe's, as the host told the step
    if nvcc:
        drop = set(flags.nvcc_drop)
        args = [a for a in args if a not in drop]
    if "-c" not in args and not (nvcc and "-dlink" in args):
        return relocatable_rpaths(args, dict(roots).get("SITE"))
    # A fixed order (not the paths' lengths, which vary with the build folder), the tree
    # last so that it wins where it sits inside another root. (nvcc's shim CUDA home
    # needs no map: its nvcc.profile spells every path as the real home's.)
    order = {"CUDA": 0, "SITE": 1, "TREE": 2}
    maps = [
        f"-ffile-prefix-map={path}={PREFIX_TARGETS.get(name, '/' + name.lower())}"
        for name, path in sorted(roots, key=lambda r: (order.get(r[0], -1), r[0]))
    ]
    args = relative_paths(args, dict(roots).get("TREE"))
    if not nvcc:
        cxx = "-c" in args and any(a.endswith(CXX_SUFFIXES) for a in args)
        append = list(flags.cxx_append) if cxx else []
        return [*args, *append, *maps]
    if "-c" in args:
        args = [*args, *flags.nvcc_append]
    extra = [x for m in maps for x in ("-Xcompiler", m)]
    sources = [a for a in args if a.endswith(".cu") and os.path.isfile(a)]
    if len(sources) == 1:
        tree = dict(roots).get("TREE")
        src = os.path.realpath(sources[0])
        rel = (
            os.path.relpath(src, tree)
            if tree and src.startswith(tree + os.sep)
            else os.path.basename(src)
        )
        extra += ["-Xcudafe", f"--orig_src_path_name={rel}"]
    return [*args, *extra]


def nested_main(argv: list[str]) -> int:
    """``objcache.py REAL_COMPILER ARGS...`` inside a compile the wrapper already runs
    (nvcc's calls of its host compiler, several per CUDA unit): the same flags, no cache,
    no gate, and the real compiler in this process's place (``exec``)."""
    compiler = argv[1]
    args = deterministic_args(compiler, argv[2:], env_roots())
    if is_nvcc(compiler) and contract.Archs.from_env(os.environ).rewrite:
        rewrite = archflags()
        try:
            args = rewrite.from_environment(args, rewrite.unit_of(args) or "nvcc")
        except rewrite.ArchFlagError as exc:
            print(f"{rewrite.PREFIX}{exc}", file=sys.stderr)
            return 1
    try:
        os.execvp(compiler, [compiler, *args])
    except OSError as exc:
        print(f"kiln: cannot run the compiler {compiler}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(nested_main(sys.argv))
