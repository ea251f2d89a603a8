"""What a ``setup.py`` says about its build, read without running it (its syntax tree).

Running an upstream's setup.py to learn about it would run its code (imports, network,
``git submodule update``) on the machine that only wanted a recipe; the facts kiln needs
are plain in its text: the environment variables it reads (directly or through a helper
such as ``is_flag_set("X")``), the names it binds to them, the string constants it
passes (arch flags, ``-std=``, ``--threads``, ``-lineinfo``, source files), the
``if`` statements that guard each arch flag or a download, and its ``assert``s.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Calls that fetch something from the network, by the called name (the last part).
NETWORK_CALLS = frozenset({"urlopen", "urlretrieve", "hf_hub_download", "download_url"})
# A command (a list of constants) that reaches the network: (program, first argument).
NETWORK_COMMANDS = (
    ("git", "clone"),
    ("git", "fetch"),
    ("git", "submodule"),
    ("curl", None),
    ("wget", None),
    ("pip", "install"),
)
# nvcc flags that record the build directory or source mtimes in device code
# (docs/reproducibility.md): kiln's compiler wrapper drops them (build.nvcc_drop_flags).
UNREPRODUCIBLE_NVCC_FLAGS = ("-lineinfo", "--generate-line-info", "--source-in-ptx")
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")

_ARCH_IN_FLAG = re.compile(
    r"(?:\bcode|\barch|--gpu-architecture|--gpu-code|-arch)\s*=\s*\[?\s*((?:sm|compute)_\d+[af]?)"
)
_SM = re.compile(r"\bsm_(\d+[af]?)\b")
_TORCH_ARCH = re.compile(r"^\d{1,2}\.\d[af]?(\+PTX)?$")


def _all_archs(elts: list[ast.expr], every: bool = True) -> tuple[str, ...]:
    """The TORCH_CUDA_ARCH_LIST spellings among string constants (``every``: only where
    all of them are, else none)."""
    values = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    archs = tuple(v for v in values if _TORCH_ARCH.match(v))
    if every and (not archs or len(archs) != len(elts)):
        return ()
    return archs


_STD = re.compile(r"^--?std=(?:c|gnu)\+\+(\d\w)$")
_STD_NUMBER = {"11": 11, "0x": 11, "14": 14, "1y": 14, "17": 17, "1z": 17, "20": 20, "2a": 20}
_STD_NUMBER |= {"23": 23, "2b": 23, "26": 26, "2c": 26}
# A test that holds on ROCm builds (``if IS_HIP_EXTENSION:``, ``torch.version.hip is not
# None``, ``if ROCM_HOME:``): the branch it guards never runs for a CUDA wheel.
_HIP_WORD = re.compile(r"(?:^|_)(?:hip|rocm)(?:_|$)", re.IGNORECASE)
_HIP = re.compile(
    r"\b(?:IS_HIP_EXTENSION|ROCM_HOME|ROCM_VERSION|USE_ROCM|BUILD_ROCM|hip|"
    r"is_hip\w*|is_rocm\w*|IS_HIP\w*|IS_ROCM\w*)\b"
)


@dataclass(frozen=True)
class Seen:
    """Evidence: where kiln saw something and what the line says."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.text}`"


@dataclass(frozen=True)
class EnvRead:
    name: str
    default: str | None
    seen: Seen


@dataclass(frozen=True)
class ArchFlag:
    """An arch flag setup.py passes itself; ``archs`` empty when the flag is computed
    (``"-gencode=arch=compute_%s,code=%s" % ...``). ``toggle``: the variable and value
    that leave it out, when the flag is added under an ``if`` on an environment variable."""

    archs: tuple[str, ...]
    seen: Seen
    toggle: tuple[str, str] | None = None


@dataclass(frozen=True)
class Pinned:
    """A variable the build needs at one value, and why."""

    name: str
    value: str
    seen: Seen
    why: str


@dataclass
class SetupPy:
    file: str
    env_reads: list[EnvRead] = field(default_factory=list)
    arch_flags: list[ArchFlag] = field(default_factory=list)
    asserted: list[Pinned] = field(default_factory=list)
    download_guards: list[Pinned] = field(default_factory=list)
    network: list[Seen] = field(default_factory=list)  # reached with no variable to stop it
    torch_extension: Seen | None = None  # torch.utils.cpp_extension's CUDAExtension/CppExtension
    build_extension: Seen | None = None  # torch's BuildExtension (ninja, MAX_JOBS)
    # torch.cuda.is_available(): setup.py asks for a GPU where it builds (none answers on a
    # build machine: it builds no CUDA code unless a variable of its own forces it)
    gpu_probe: Seen | None = None
    sources: list[tuple[str, Seen]] = field(default_factory=list)
    std_flags: list[tuple[int, Seen]] = field(default_factory=list)
    threads_flag: Seen | None = None
    unreproducible: list[tuple[str, Seen]] = field(default_factory=list)
    extension_names: list[str] = field(default_factory=list)  # CUDAExtension(name=...)
    imports: list[tuple[str, Seen]] = field(default_factory=list)  # top-level modules it imports
    # dicts keyed by TORCH_CUDA_ARCH_LIST's spelling ("10.0a": ...): the upstream's own
    # arch table, which builds only the archs it has an entry for
    arch_tables: list[tuple[tuple[str, ...], Seen]] = field(default_factory=list)
    # setup(install_requires=[...]) written as literal strings: what the wheel requires
    install_requires: list[tuple[str, Seen]] = field(default_factory=list)
    problem: str | None = None  # why it could not be read


def read(tree: Path, rel: str) -> SetupPy:
    """Everything kiln reads from ``rel`` (a setup.py or a module of the tree it imports)."""
    path = tree / rel
    text = path.read_text(errors="replace")
    out = SetupPy(rel)
    try:
        module = ast.parse(text, filename=rel)
    except SyntaxError as exc:
        out.problem = f"{rel}:{exc.lineno}: not Python that kiln can read ({exc.msg})"
        return out
    _Reader(tree, path.parent, rel, text, module, out).run()
    return out


def local_imports(tree: Path, rel: str) -> list[str]:
    """The tree's own modules ``rel`` imports (``from scripts.x import y``: scripts/x.py)."""
    try:
        module = ast.parse((tree / rel).read_text(errors="replace"))
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(module):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            for cand in (f"{name.replace('.', '/')}.py", f"{name.replace('.', '/')}/__init__.py"):
                if (tree / cand).is_file() and cand != rel:
                    found.append(cand)
                    break
    return sorted(set(found))


# --------------------------------------------------------------------------- the reader


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name)
    return isinstance(node, ast.Name) and node.id == "environ"


def _hip_when_true(test: ast.AST) -> bool | None:
    """Whether ``test`` holds on ROCm (True), on CUDA (False), or says nothing of it."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _hip_when_true(test.operand)
        return None if inner is None else not inner
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        inner = _hip_when_true(test.left)
        if inner is None or not isinstance(test.ops[0], ast.Is | ast.IsNot | ast.Eq | ast.NotEq):
            return None
        return inner if isinstance(test.ops[0], ast.IsNot | ast.NotEq) else not inner
    if isinstance(test, ast.Name | ast.Attribute | ast.Call) and _HIP.search(ast.unparse(test)):
        return True
    # a flag of the upstream's own naming: HIP_BUILD, USE_ROCM, build_hip (causal-conv1d's
    # `HIP_BUILD = bool(torch.version.hip)`), HIP or ROCm as one word of the identifier
    name = (
        test.id
        if isinstance(test, ast.Name)
        else test.attr
        if isinstance(test, ast.Attribute)
        else ""
    )
    if _HIP_WORD.search(name):
        return True
    return None


def _called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _const(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        return str(node.value)
    return None


class _Reader:
    def __init__(
        self, tree: Path, here: Path, rel: str, text: str, module: ast.Module, out: SetupPy
    ) -> None:
        self.tree, self.here, self.rel, self.module, self.out = tree, here, rel, module, out
        self.lines = text.splitlines()
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(module):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.helpers: dict[str, int] = {}  # function -> index of the parameter it reads
        self.names: dict[str, set[str]] = {}  # bound name -> the variables it derives from
        # bound name -> the comparison it holds (``FORCE = getenv("X", "0") == "TRUE"``)
        self.compares: dict[str, ast.Compare] = {}
        self.rocm_only = self._rocm_only()

    def _rocm_only(self) -> set[ast.AST]:
        """The nodes of the branches that run only on ROCm: nothing there is cited or
        read (a CUDA build never takes them)."""
        off: set[ast.AST] = set()
        for node in ast.walk(self.module):
            if not isinstance(node, ast.If | ast.IfExp):
                continue
            hip = _hip_when_true(node.test)
            if hip is None:
                continue
            branch = node.body if hip else node.orelse
            parts: list[ast.AST] = list(branch) if isinstance(branch, list) else [branch]
            for part in parts:
                off.update(ast.walk(part))
        return off

    def _walk(self) -> Iterator[ast.AST]:
        """The module's nodes on the path a CUDA build runs."""
        return (n for n in ast.walk(self.module) if n not in self.rocm_only)

    def _literal(self, node: ast.expr) -> ast.expr:
        """``node``, or where it is a name the module assigns once at its top, that value."""
        if not isinstance(node, ast.Name):
            return node
        bound = [
            st.value
            for st in self.module.body
            if isinstance(st, ast.Assign) and [ast.unparse(t) for t in st.targets] == [node.id]
        ]
        return bound[0] if len(bound) == 1 else node

    def seen(self, node: ast.AST) -> Seen:
        line = getattr(node, "lineno", 0)
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        return Seen(self.rel, line, text if len(text) <= 110 else text[:107] + "...")

    def run(self) -> None:
        self._find_helpers()
        self._bind_names()
        self._env_reads()
        self._imports()
        self._arch_tables()
        self._strings()
        self._asserts()
        self._network()

    # ---- environment variables

    def _direct(self, node: ast.AST, params: tuple[str, ...] = ()) -> tuple[str, str | None] | None:
        """(variable, default) when ``node`` reads one; a parameter name stands for itself."""

        def key(arg: ast.AST) -> str | None:
            if isinstance(arg, ast.Name) and arg.id in params:
                return "$" + arg.id
            value = _const(arg)
            return value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None

        if isinstance(node, ast.Call) and node.args:
            f = node.func
            getenv = (isinstance(f, ast.Attribute) and f.attr == "getenv") or (
                isinstance(f, ast.Name) and f.id == "getenv"
            )
            get = isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value)
            if getenv or get:
                name = key(node.args[0])
                return (
                    (name, _const(node.args[1]) if len(node.args) > 1 else None) if name else None
                )
            if isinstance(f, ast.Name) and f.id in self.helpers:
                i = self.helpers[f.id]
                if i < len(node.args):
                    name = key(node.args[i])
                    return (name, None) if name else None
        if (
            isinstance(node, ast.Subscript)
            and _is_environ(node.value)
            and isinstance(node.ctx, ast.Load)
        ):
            name = key(node.slice)
            return (name, None) if name else None
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _is_environ(node.comparators[0])
        ):
            name = key(node.left)
            return (name, None) if name else None
        return None

    def _find_helpers(self) -> None:
        """Functions that read the variable their argument names (``is_flag_set(flag)``)."""
        for _ in range(2):  # a helper may call another
            for fn in ast.walk(self.module):
                if not isinstance(fn, ast.FunctionDef):
                    continue
                params = tuple(a.arg for a in fn.args.args)
                for node in ast.walk(fn):
                    found = self._direct(node, params)
                    if found and found[0].startswith("$"):
                        self.helpers[fn.name] = params.index(found[0][1:])

    def env_in(self, node: ast.AST) -> set[str]:
        """The variables an expression depends on: read there, or through a bound name."""
        found: set[str] = set()
        for sub in ast.walk(node):
            direct = self._direct(sub)
            if direct and not direct[0].startswith("$"):
                found.add(direct[0])
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                found |= self.names.get(sub.id, set())
        return found

    def _bind_names(self) -> None:
        for _ in range(2):  # names bound from other bound names
            for node in ast.walk(self.module):
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    deps = self.env_in(node.value)
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if isinstance(t, ast.Name) and deps:
                            self.names.setdefault(t.id, set()).update(deps)
                            if isinstance(node.value, ast.Compare):
                                self.compares[t.id] = node.value

    def compared(self, test: ast.AST) -> tuple[bool, str] | None:
        """(whether it is ``==``, the constant) where ``test`` compares one variable with
        a constant, itself or through a name bound to that comparison."""
        if isinstance(test, ast.Name) and test.id in self.compares:
            test = self.compares[test.id]
        if not isinstance(test, ast.Compare) or len(test.ops) != 1:
            return None
        if not isinstance(test.ops[0], ast.Eq | ast.NotEq):
            return None
        sides = (test.left, test.comparators[0])
        const = [x for x in sides if isinstance(x, ast.Constant)]
        other = [x for x in sides if not isinstance(x, ast.Constant)]
        if len(const) != 1 or len(other) != 1 or len(self.env_in(other[0])) != 1:
            return None
        return isinstance(test.ops[0], ast.Eq), str(const[0].value)

    def skip_value(self, test: ast.AST, skip_when_true: bool, negated: bool) -> str:
        """The value of the test's variable that skips what it guards: for a comparison
        with a constant, that constant (or another value, as the comparison needs:
        ``getenv("X_FORCE_BUILD", "FALSE") == "TRUE"`` is skipped by "TRUE", not "1");
        else a true or a false value."""
        cmp = self.compared(test.operand if negated and isinstance(test, ast.UnaryOp) else test)
        if cmp is None:
            return "1" if skip_when_true != negated else "0"
        eq, const = cmp
        if (skip_when_true != negated) == eq:
            return const  # the test is as needed exactly when the variable is the constant
        return "0" if const != "0" else "1"  # any value but the constant

    def _env_reads(self) -> None:
        seen: set[tuple[str, int]] = set()
        for node in self._walk():
            direct = self._direct(node)
            if direct and not direct[0].startswith("$"):
                where = self.seen(node)
                if (direct[0], where.line) not in seen:
                    seen.add((direct[0], where.line))
                    self.out.env_reads.append(EnvRead(direct[0], direct[1], where))
        self.out.env_reads.sort(key=lambda r: (r.seen.line, r.name))

    # ---- imports, strings, flags

    def _arch_tables(self) -> None:
        """The upstream's own arch tables, in any of the forms setup.py files write them:
        a dict keyed by TORCH_CUDA_ARCH_LIST's spellings, an ``if``/``elif`` chain that
        compares an arch with them, a loop or a list over them."""
        in_chain: set[int] = set()
        for node in self._walk():
            archs: tuple[str, ...] = ()
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                archs = tuple(k for k in keys if isinstance(k, str) and _TORCH_ARCH.match(k))
                if len(archs) != len(node.keys):
                    archs = ()
            elif isinstance(node, ast.If) and id(node) not in in_chain:
                archs = self._if_chain_archs(node, in_chain)
            elif isinstance(node, ast.For) and isinstance(node.iter, ast.List | ast.Tuple):
                archs = _all_archs(node.iter.elts)
            elif isinstance(node, ast.Assign) and isinstance(
                node.value, ast.List | ast.Tuple | ast.Set
            ):
                archs = _all_archs(node.value.elts)
                archs = archs if len(archs) > 1 else ()
            if archs:
                self.out.arch_tables.append((archs, self.seen(node)))

    def _if_chain_archs(self, node: ast.If, in_chain: set[int]) -> tuple[str, ...]:
        """The archs an ``if``/``elif`` chain compares with (``arch == "10.0a"``, ``arch
        in ("9.0a", "10.0a")``), its branches marked so each chain counts once."""
        found: list[str] = []
        current: ast.If | None = node
        while current is not None:
            in_chain.add(id(current))
            for sub in ast.walk(current.test):
                if isinstance(sub, ast.Compare):
                    for c in [sub.left, *sub.comparators]:
                        elts = c.elts if isinstance(c, ast.List | ast.Tuple | ast.Set) else [c]
                        found += _all_archs(elts, every=False)
            nxt = current.orelse
            current = nxt[0] if len(nxt) == 1 and isinstance(nxt[0], ast.If) else None
        return tuple(dict.fromkeys(found))

    def _probes_deciding_nothing(self) -> set[int]:
        """The calls in the test of an ``if``/``elif`` chain whose last ``else`` does what
        its first branch does (rahul-goel/fused-ssim: ``if torch.cuda.is_available():
        configure_cuda()`` ... ``else: configure_cuda()``): where no GPU answers, the
        CUDA code is built all the same, so such a probe decides nothing."""
        found: set[int] = set()
        for node in self._walk():
            if not isinstance(node, ast.If):
                continue
            last: ast.If = node
            while len(last.orelse) == 1 and isinstance(last.orelse[0], ast.If):
                last = last.orelse[0]
            if last.orelse and [ast.dump(st) for st in last.orelse] == [
                ast.dump(st) for st in node.body
            ]:
                found |= {id(sub) for sub in ast.walk(node.test) if isinstance(sub, ast.Call)}
        return found

    def _imports(self) -> None:
        seen_imports: set[str] = set()
        deciding_nothing = self._probes_deciding_nothing()
        for node in self._walk():
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in seen_imports:
                    seen_imports.add(top)
                    self.out.imports.append((top, self.seen(node)))
            if isinstance(node, ast.Call) and _called(node) in ("setup", "setuptools.setup"):
                for k in node.keywords:
                    # a literal list, or a name the module binds to one once
                    # (rusty1s/pytorch_cluster: `install_requires = ['scipy']`, then
                    # `install_requires=install_requires`)
                    value = self._literal(k.value) if k.arg == "install_requires" else None
                    if isinstance(value, ast.List | ast.Tuple):
                        self.out.install_requires += [
                            (e.value, self.seen(value))
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        ]
            if (
                isinstance(node, ast.Call)
                and _called(node) == "is_available"
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute | ast.Name)
                and ast.unparse(node.func.value).endswith("cuda")
                and not self.out.gpu_probe
                and id(node) not in deciding_nothing
            ):
                self.out.gpu_probe = self.seen(node)
            if isinstance(node, ast.Call) and _called(node).endswith("Extension"):
                named = [k.value for k in node.keywords if k.arg == "name"]
                first = named[0] if named else (node.args[0] if node.args else None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    self.out.extension_names.append(first.value)
            if isinstance(node, ast.ImportFrom) and node.module == "torch.utils.cpp_extension":
                imported = {a.name for a in node.names}
                if imported & {"CUDAExtension", "CppExtension"} and not self.out.torch_extension:
                    self.out.torch_extension = self.seen(node)
                if "BuildExtension" in imported and not self.out.build_extension:
                    self.out.build_extension = self.seen(node)
            # the module imported whole: `from torch.utils import cpp_extension` then
            # `cpp_extension.CUDAExtension(...)` (IST-DASLab/marlin), or `torch.utils.
            # cpp_extension.BuildExtension`
            if isinstance(node, ast.Attribute) and ast.unparse(node.value).endswith(
                "cpp_extension"
            ):
                if node.attr in ("CUDAExtension", "CppExtension") and not self.out.torch_extension:
                    self.out.torch_extension = self.seen(node)
                if node.attr == "BuildExtension" and not self.out.build_extension:
                    self.out.build_extension = self.seen(node)

    def _strings(self) -> None:
        for node in self._walk():
            if isinstance(node, ast.JoinedStr | ast.BinOp):
                self._computed_arch_flag(node)
                continue
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            s = node.value.strip()
            if isinstance(self.parent.get(node), ast.JoinedStr):
                continue
            archs = _ARCH_IN_FLAG.findall(s)
            if archs:
                sms = tuple(dict.fromkeys("sm_" + m for m in _SM.findall(s.split("code=")[-1])))
                self.out.arch_flags.append(
                    ArchFlag(sms or tuple(archs), self.seen(node), self._toggle(node))
                )
            elif (m := _STD.match(s)) and m.group(1) in _STD_NUMBER:
                self.out.std_flags.append((_STD_NUMBER[m.group(1)], self.seen(node)))
            elif s == "--threads" or s.startswith("--threads="):
                self.out.threads_flag = self.out.threads_flag or self.seen(node)
            elif s in UNREPRODUCIBLE_NVCC_FLAGS:
                self.out.unreproducible.append((s, self.seen(node)))
            elif s.endswith(SOURCE_SUFFIXES):
                self._source(s, node)

    def _computed_arch_flag(self, node: ast.JoinedStr | ast.BinOp) -> None:
        parts = [
            v.value
            for v in ast.walk(node)
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
        text = "".join(parts)
        if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Mod):
            return
        if "arch=compute_" in text or "-gencode" in text or "code=sm_" in text:
            self.out.arch_flags.append(ArchFlag((), self.seen(node), None))

    def _source(self, s: str, node: ast.AST) -> None:
        for base in (self.tree, self.here):
            matches = sorted(base.glob(s)) if "*" in s else [base / s]
            files = [m for m in matches if m.is_file()]
            if files:
                for f in files:
                    rel = str(f.resolve().relative_to(self.tree.resolve()))
                    self.out.sources.append((rel, self.seen(node)))
                return

    def _ifs(self, node: ast.AST) -> Iterator[tuple[ast.If, bool]]:
        """The ``if`` statements around ``node``, innermost first, and whether ``node``
        is in the body (True) or the ``else`` (False)."""
        child, up = node, self.parent.get(node)
        while up is not None:
            if isinstance(up, ast.If) and child is not up.test:
                yield up, any(child is n for n in up.body)
            child, up = up, self.parent.get(up)

    def _toggle(self, node: ast.AST) -> tuple[str, str] | None:
        """The variable and value that leave out the flag ``node`` adds, when an ``if``
        on one variable (``if not DISABLE_SM90:``) guards it."""
        for stmt, in_body in self._ifs(node):
            negated = isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)
            deps = self.env_in(stmt.test)
            if len(deps) == 1 and isinstance(stmt.test, ast.UnaryOp | ast.Name | ast.Call):
                added_when_true = in_body != negated
                return next(iter(deps)), "0" if added_when_true else "1"
        return None

    # ---- asserts and downloads

    def _asserts(self) -> None:
        for node in self._walk():
            if not isinstance(node, ast.Assert) or not isinstance(node.test, ast.Compare):
                continue
            t = node.test
            if len(t.ops) != 1 or not isinstance(t.ops[0], ast.Eq):
                continue
            for side, other in ((t.left, t.comparators[0]), (t.comparators[0], t.left)):
                value = _const(other)
                names = {d[0] for s in ast.walk(side) if (d := self._direct(s))}
                if value is not None and len(names) == 1 and isinstance(other, ast.Constant):
                    when = [ast.unparse(i.test) for i, body in self._ifs(node) if body]
                    why = "setup.py asserts it" + (f" when {' and '.join(when)}" if when else "")
                    self.out.asserted.append(Pinned(names.pop(), value, self.seen(node), why))
                    break

    def _is_network(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        if _called(node) in NETWORK_CALLS or (
            _called(node) in ("get", "post") and "requests" in ast.unparse(node.func)
        ):
            return True
        if node.args and isinstance(node.args[0], ast.List):
            words = [_const(e) for e in node.args[0].elts[:2]]
            return any(
                words[0] == prog and (arg is None or (len(words) > 1 and words[1] == arg))
                for prog, arg in NETWORK_COMMANDS
            )
        return False

    def _uses(self, variable: str) -> int:
        """How often setup.py uses a variable: its reads and the names bound to it."""
        count = sum(1 for r in self.out.env_reads if r.name == variable)
        bound = {n for n, deps in self.names.items() if deps == {variable}}
        for node in ast.walk(self.module):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound:
                count += 1
        return count

    def _network(self) -> None:
        for node in self._walk():
            if not self._is_network(node):
                continue
            options = self._guards(node)
            # A guard variable setup.py uses for nothing else changes only the download.
            # (Read once and tested once: ``X = getenv("X")`` and the guard itself.)
            quiet = [(v, value, g) for v, value, g in options if self._uses(v) <= 2]
            if quiet:
                v, value, g = quiet[0]
                call = self.seen(node)
                why = f"{v}={value} skips the download at line {call.line} ({call.text})"
                others = sorted({o for o, _, _ in options} - {o for o, _, _ in quiet})
                if others:
                    why += f"; {', '.join(others)} would too, but setup.py uses it for more"
                self.out.download_guards.append(Pinned(v, value, g, why))
            else:
                self.out.network.append(self.seen(node))

    def _guards(self, call: ast.AST) -> list[tuple[str, str, Seen]]:
        """(variable, value that skips ``call``, the guard's line), from the ``if``
        statements around it and the early returns before it in its function."""
        options: list[tuple[str, str, Seen]] = []
        for stmt, in_body in self._ifs(call):
            negated = isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)
            deps = self.env_in(stmt.test)
            if len(deps) == 1:
                skip_when_true = not in_body  # the call runs in the body when the test holds
                value = self.skip_value(stmt.test, skip_when_true, negated)
                options.append((next(iter(deps)), value, self.seen(stmt)))
        fn, up = None, self.parent.get(call)
        top: ast.AST = call
        while up is not None and not isinstance(up, ast.FunctionDef):
            top, up = up, self.parent.get(up)
        fn = up
        if isinstance(fn, ast.FunctionDef):
            for early in fn.body:
                if early is top:
                    break
                if (
                    isinstance(early, ast.If)
                    and early.body
                    and isinstance(early.body[-1], ast.Return)
                ):
                    terms = (
                        early.test.values
                        if isinstance(early.test, ast.BoolOp) and isinstance(early.test.op, ast.Or)
                        else [early.test]
                    )
                    for term in terms:
                        negated = isinstance(term, ast.UnaryOp) and isinstance(term.op, ast.Not)
                        deps = self.env_in(term)
                        if len(deps) == 1:
                            value = self.skip_value(term, True, negated)
                            options.append((next(iter(deps)), value, self.seen(early)))
        return options
