"""A failed build step's output, read for its first errors: the unit whose compile or link
failed (ninja's ``FAILED:`` target, nvcc's or g++'s include chain), the first error lines
(``file:line: message``, deduplicated, a handful at most) and, from the cause table
(:mod:`kiln.inside.causes`), what most likely caused them and the fix. Standard library
only: it runs inside the step, where the build ran (the builder container for the Docker
runner), so the headers and libraries it names are the ones that build saw.

The step writes the result as JSON (``KILN_STEP_FAILURE``) beside the logs; the host
shows it on the first screen (:mod:`kiln.orchestrate.failure`). A build backend's Python
traceback is never the summary: it is read only when no compiler or linker said anything.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from kiln.inside.causes import table
from kiln.inside.causes.cause import Diagnosis, ErrorLine
from kiln.inside.causes.link import link_output
from kiln.inside.kit import archflags, compileflags

MAX_ERRORS = 5
SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c", ".C", ".c++")


# g++/gcc/clang: "file:12:3: fatal error: x.h: No such file or directory", "file:4: error: ..."
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+):(?:\d+:)? (?P<kind>fatal error|error): (?P<msg>.*)$"
)
# nvcc's front end (EDG, cudafe++): 'file(85): error: identifier "x" is undefined'
_EDG = re.compile(
    r"^(?P<file>\S[^(]*?)\((?P<line>\d+)\): (?P<kind>catastrophic error|error): (?P<msg>.*)$"
)
_TOOL_FATAL = re.compile(
    r"^(?P<tool>nvcc|ptxas|nvlink|cicc|cudafe\+\+|fatbinary)\s*(?:fatal|error)\s*:\s*(?P<msg>.*)$"
)
# the C/C++ compiler's own fatal errors, with no file:line of the source (cc1plus cannot
# write its output, as cannot the assembler: "cc1plus: fatal error: when writing output to
# /tmp/x.ii: No space left on device")
_CC_FATAL = re.compile(
    r"^(?P<tool><built-in>|cc1plus|cc1|cc1obj|as|(?:\S*/)?(?:[\w.-]+-)?"
    r"(?:g\+\+|gcc|c\+\+|cc|clang\+*)(?:-[\d.]+)?)\s*: (?P<kind>fatal error|error): (?P<msg>.*)$"
    r"|^(?:\S+: )?(?P<as>Fatal error): (?P<asmsg>.*)$"  # the assembler's
)
_PTXAS_LINE = re.compile(r"^ptxas (?P<file>\S+), line (?P<line>\d+); error\s*: (?P<msg>.*)$")
_LD = re.compile(r"^(?:\S*/)?(?:ld|ld\.\w+|collect2|lld)(?::| error:) (?P<msg>.*)$")
_LD_UNDEFINED = re.compile(
    r"^(?:\S*/)?(?:ld(?:\.\w+)?: )?(?P<file>[^:\s][^:]*?):\([^)]*\): "
    r"(?P<msg>undefined reference to .*)$"
)
# kiln's compiler wrapper: refusing an nvcc call's archs (arch_control = "rewrite"), or an
# error of its own (a compile's output gone under it)
_KILN_ARCH = re.compile(
    "^(?:" + re.escape(archflags.PREFIX) + "|" + re.escape(compileflags.WRAPPER_PREFIX) + ")"
    r"(?:(?P<file>[^\s:]+): )?(?P<msg>.+)$"
)
_INCLUDED = re.compile(r"^(?:In file included|\s+) from (?P<file>[^:]+):(?P<line>\d+)[:,]$")
# template instantiation context: g++ prints it before the error, nvcc after it
_GCC_INSTANTIATION = re.compile(r"^(?P<file>[^\s:][^:]*?): In instantiation of (?P<what>.+):$")
_GCC_REQUIRED = re.compile(
    r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+):(?:\d+:)?\s+"
    r"(?P<what>(?:recursively )?required (?:from|by substitution of) .+)$"
)
_EDG_INSTANTIATION = re.compile(
    r"^\s+(?:detected during\s+)?instantiation of (?P<what>.+?) at line (?P<line>\d+)"
    r"(?: of (?P<file>\S+?))?\s*$"
)
# CMake's own errors: "CMake Error at CMakeLists.txt:5 (target_link_libraries):" then the
# message indented below it (scikit-build-core prints only "CMake configuration failed")
_CMAKE_ERROR = re.compile(
    r"^CMake Error(?: at (?P<file>[^\s:][^:]*?):(?P<line>\d+) \((?P<cmd>[^)]*)\))?:\s*(?P<msg>.*)$"
)
CMAKE_MESSAGE_WIDTH = 240
_EDG_HIDDEN = re.compile(r"^\s+\[ (?P<n>\d+) instantiation contexts not shown \]$")
CHAIN_SHOWN = 4  # the innermost context and the last ones, which reach the upstream's code
CHAIN_WIDTH = 160


def cut_chain(chain: list[str]) -> tuple[str, ...]:
    """The chain for the screen: its first line (the instantiation that failed), a count
    of those skipped, and its last lines (down to the upstream's own call), each cut."""
    short = [c if len(c) <= CHAIN_WIDTH else c[: CHAIN_WIDTH - 3] + "..." for c in chain]
    if len(short) <= CHAIN_SHOWN:
        return tuple(short)
    tail = short[-(CHAIN_SHOWN - 1) :]
    hidden = [_HIDDEN_LINE.match(c) for c in short[1 : -(CHAIN_SHOWN - 1)]]
    skipped = sum(int(h["n"]) if h else 1 for h in hidden)
    return (short[0], f"... ({skipped} more instantiations)", *tail)


_HIDDEN_LINE = re.compile(r"^\[(?P<n>\d+) instantiation contexts not shown\]$")


_NINJA_FAILED = re.compile(r"^FAILED: (?P<target>.+?)\s*$")
_PYTHON_EXC = re.compile(
    r"^(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Exit|error)): (?P<msg>.+)$"  # socket.gaierror
)
# A tool's summary of errors already shown, or a wrapper's restatement: never a first error.
_NOISE = (
    "ld returned 1 exit status",
    "compilation terminated",
    "Error compiling objects for extension",
    "errors detected in the compilation",
    "error detected in the compilation",
)


def _relative(path: str, tree: Path | None) -> str:
    """``path`` as the user finds it: relative to the tree when inside it (ninja prints
    paths relative to its build folder, ``../../csrc/x.cu``: the part that exists in the
    tree is taken), else the whole path (one a user can open)."""
    if tree is None:
        return path
    p = Path(os.path.normpath(path))
    if p.is_absolute():
        try:
            return str(p.relative_to(tree))
        except ValueError:
            return path
    parts = p.parts
    while parts and parts[0] == "..":
        parts = parts[1:]
        if (tree.joinpath(*parts)).exists():
            return str(Path(*parts))
    return path


_LINK_CMD = re.compile(r"(?:^|\s)-shared(?:\s|$)")


def _unit_of(command: str) -> str | None:
    """The source file a compile command compiles (the argument after ``-c``, else the
    last one with a source suffix)."""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    for i, arg in enumerate(argv[:-1]):
        if arg == "-c" and argv[i + 1].endswith(SOURCE_SUFFIXES):
            return argv[i + 1]
    sources = [a for a in argv if a.endswith(SOURCE_SUFFIXES)]
    return sources[-1] if sources else None


def _match(text: str) -> tuple[ErrorLine, bool] | None:
    """(the error on this line, whether it names a file), or None."""
    for rx, tool in ((_GCC, "gcc"), (_EDG, "nvcc")):
        m = rx.match(text)
        if m:
            msg = m["msg"].strip()
            kind = m["kind"]
            message = f"{kind}: {msg}"
            return ErrorLine(message, m["file"], int(m["line"]), tool), True
    m = _KILN_ARCH.match(text)
    if m:
        return ErrorLine(m["msg"].strip(), m["file"], None, "kiln"), bool(m["file"])
    m = _PTXAS_LINE.match(text)
    if m:
        return ErrorLine(f"error: {m['msg'].strip()}", m["file"], int(m["line"]), "ptxas"), True
    m = _TOOL_FATAL.match(text)
    if m:
        return ErrorLine(f"{m['tool']} fatal: {m['msg'].strip()}", tool=m["tool"]), False
    m = _CC_FATAL.match(text)
    if m and m["as"]:
        return ErrorLine(f"as: fatal error: {m['asmsg'].strip()}", tool="gcc"), False
    if m:
        tool = m["tool"].rsplit("/", 1)[-1]
        return ErrorLine(f"{tool}: {m['kind']}: {m['msg'].strip()}", tool="gcc"), False
    m = _LD_UNDEFINED.match(text)
    if m:
        return ErrorLine(m["msg"].strip(), m["file"], None, "ld"), True
    m = _LD.match(text)
    if m and any(w in m["msg"] for w in ("cannot find", "undefined", "error", "failed")):
        return ErrorLine(m["msg"].strip(), tool="ld"), False
    return None


def first_errors(output: str, tree: Path | None = None) -> Diagnosis:
    """The unit and first errors of a failed step's ``output`` (no cause yet)."""
    d = Diagnosis()
    seen: set[tuple[str | None, int | None, str]] = set()
    include_top: str | None = None  # the outermost file of the current include chain
    pending_failed = False
    python_errors: list[ErrorLine] = []
    link: str | None = None  # the last link command line seen (setuptools prints it)
    context: list[str] = []  # g++'s instantiation lines waiting for their error
    chains: dict[int, list[str]] = {}  # error index -> its instantiation chain
    last: int | None = None  # the error nvcc's "detected during" lines belong to
    for raw in output.splitlines():
        text = raw.rstrip()
        m = _GCC_INSTANTIATION.match(text)
        if m:
            context = [f"in instantiation of {m['what']} ({_relative(m['file'], tree)})"]
            continue
        m = _GCC_REQUIRED.match(text)
        if m:
            context.append(f"{m['what']} at {_relative(m['file'], tree)}:{m['line']}")
            continue
        m = _EDG_INSTANTIATION.match(text)
        if m and last is not None:
            err_file = d.errors[last].file
            where = _relative(m["file"], tree) if m["file"] else err_file
            chains.setdefault(last, []).append(
                f"instantiation of {m['what']} at {where}:{m['line']}"
            )
            continue
        m = _EDG_HIDDEN.match(text)
        if m and last is not None:
            chains.setdefault(last, []).append(f"[{m['n']} instantiation contexts not shown]")
            continue
        if _LINK_CMD.search(text):
            link = text
        if pending_failed:  # the line after ninja's FAILED: is the failed command
            pending_failed = False
            if d.command is None:
                d.command = text
                unit = _unit_of(text)
                if unit and d.unit is None:
                    d.unit = _relative(unit, tree)
            continue
        m = _NINJA_FAILED.match(text)
        if m:
            pending_failed = d.command is None
            continue
        m = _INCLUDED.match(text)
        if m:
            include_top = m["file"]  # each "from" line goes one level further out
            continue
        if any(n in text for n in _NOISE):
            continue
        found = _match(text)
        if found is None:
            pm = _PYTHON_EXC.match(text)
            if pm and not pm["exc"].endswith(("CalledProcessError",)):
                python_errors.append(ErrorLine(text, tool="python"))
            continue
        err, _ = found
        if err.tool == "ld" and d.unit is None and link is not None:
            target = link_output(link)
            d.unit = f"the link of {_relative(target, tree)}" if target else "the link"
            d.command = d.command or link
        if err.file:
            err = ErrorLine(err.message, _relative(err.file, tree), err.line, err.tool)
        if d.unit is None:
            top = include_top or err.file
            if top and top.endswith(SOURCE_SUFFIXES):
                d.unit = _relative(top, tree)
        include_top = None
        key = (err.file, err.line, err.message)
        pending, context = context, []
        if key in seen:
            last = None
            continue
        seen.add(key)
        if len(d.errors) < MAX_ERRORS:
            d.errors.append(err)
            last = len(d.errors) - 1
            if pending:
                chains[last] = pending
        else:
            last = None
    for i, chain in chains.items():
        e = d.errors[i]
        d.errors[i] = ErrorLine(e.message, e.file, e.line, e.tool, cut_chain(chain))
    configure = cmake_errors(output, tree)
    if configure:  # CMake configures before anything compiles: its errors come first
        d.errors = [*configure, *d.errors][:MAX_ERRORS]
    if not d.errors and python_errors:
        d.errors.append(python_errors[-1])  # the exception the backend ended with
    return d


def cmake_errors(output: str, tree: Path | None = None) -> list[ErrorLine]:
    """CMake's ``CMake Error`` blocks: the file:line and command it names, and its
    message (the indented lines below it, joined, cut before CMake's list of "possible
    reasons"), so the screen shows CMake's words, not only the backend's "CMake
    configuration failed"."""
    found: list[ErrorLine] = []
    lines = output.splitlines()
    for i, text in enumerate(lines):
        m = _CMAKE_ERROR.match(text.rstrip())
        if not m:
            continue
        words = [m["msg"].strip()] if m["msg"].strip() else []
        for below in lines[i + 1 :]:
            if below.strip() and not below.startswith((" ", "\t")):
                break
            if below.strip():
                words.append(below.strip())
        message = " ".join(words).split("Possible reasons include", 1)[0].strip()
        if len(message) > CMAKE_MESSAGE_WIDTH:
            message = message[: CMAKE_MESSAGE_WIDTH - 3] + "..."
        command = f" ({m['cmd']})" if m["cmd"] else ""
        where = _relative(m["file"], tree) if m["file"] else None
        line = int(m["line"]) if m["line"] else None
        err = ErrorLine(f"CMake Error{command}: {message}", where, line, "cmake")
        if err not in found:
            found.append(err)
    return found


def diagnose(output: str, tree: Path, env: Mapping[str, str], vendor: str) -> Diagnosis:
    """:func:`first_errors`, then the cause table's first row that knows them."""
    d = first_errors(output, tree)
    d.cause = table.explain(d, output, env, tree, vendor)
    return d


def write_record(path: Path, vendor: str, what: str, d: Diagnosis) -> None:
    """The failure record beside the logs (the host adds the log's path when it reads it)."""
    record = {"vendor": vendor, "failed": what, **d.to_json()}
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, path)
