"""``python -m kiln`` / ``kiln``: the command line (argument parsing and the one error
handler); each command calls its verb."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from kiln.build.options import Options
from kiln.errors import GpuTestError, Interrupted, KilnError

log = logging.getLogger("kiln")


def out(text: object) -> None:
    """A command's result, on stdout (what scripts read: a path, a table, JSON)."""
    sys.stdout.write(f"{text}\n")


def say_err(text: object) -> None:
    """A report for people, on stderr (a verify's differences, an error)."""
    sys.stderr.write(f"{text}\n")


DEFAULT_CACHE = Path(os.environ.get("KILN_CACHE_DIR", ".kiln-cache"))


def _sigterm(_signo: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _add_build_args(p: argparse.ArgumentParser, workspace: str = ".") -> None:
    p.add_argument(
        "--workspace",
        type=Path,
        default=Path(workspace),
        help=f"folder with kiln.toml, vendors/ and patches/ (default: {workspace})",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="NAME",
        help="build the [profiles.NAME] variant of kiln.toml's profile (default: [profile])",
    )
    p.add_argument(
        "--artifacts",
        type=Path,
        default=Path("artifacts"),
        help="where releases and their logs go: <artifacts>/<release>/ (default: artifacts)",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help="bare clones, build venvs, the PyPI CUDA and the caches "
        f"(default: $KILN_CACHE_DIR or {DEFAULT_CACHE})",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path("build/work"),
        help="where work trees are checked out (default: build/work)",
    )
    p.add_argument(
        "--mirrors",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML mapping upstream URL prefixes to mirrors (default: $KILN_MIRRORS, else none)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="never use the network: only the cache and local mirrors",
    )
    p.add_argument(
        "--bundles",
        type=Path,
        default=None,
        metavar="DIR",
        help="upstreams from the git bundles in DIR, as the workspace's bundles.toml names "
        "them (made into mirrors; implies --offline)",
    )
    p.add_argument(
        "--python",
        default=None,
        metavar="PYTHON",
        help="build Python holding the profile's torch "
        "(default: $KILN_BUILD_PYTHON, else a venv kiln provisions once)",
    )
    p.add_argument(
        "--cuda-home",
        default=None,
        metavar="DIR",
        help="the CUDA toolkit to compile with "
        "(default: $CUDA_HOME, nvcc on PATH, /usr/local/cuda)",
    )
    p.add_argument(
        "--toolchain",
        default="system",
        choices=["system", "pypi"],
        help="pypi: the profile's CUDA from NVIDIA's hash-pinned PyPI wheels, local runner "
        "only (default: system)",
    )
    p.add_argument(
        "--runner",
        default="auto",
        choices=["auto", "local", "docker"],
        help="where builds run; auto: docker when the profile names an image and a "
        "daemon answers, else local (default: auto)",
    )
    p.add_argument(
        "--image",
        default=None,
        metavar="REF",
        help="base image for the Docker runner, NAME:TAG@sha256:DIGEST (default: profile.image)",
    )
    p.add_argument(
        "--allow-unpinned-image",
        action="store_true",
        help="accept an image without a digest (the manifest says 'unpinned')",
    )
    p.add_argument(
        "--docker-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the builder image's folder (default: <workspace>/docker)",
    )
    p.add_argument(
        "--docker-mount",
        action="append",
        default=[],
        metavar="SRC[:DST[:ro|rw]]",
        help="an extra bind mount for build containers, e.g. a CUDA toolkit (default: none)",
    )
    p.add_argument(
        "--keep-container",
        action="store_true",
        help="keep a failed step's build container (docker start -ai it to look inside)",
    )
    p.add_argument(
        "--mem-limit",
        type=float,
        default=None,
        metavar="GIB",
        help="memory limit of a build step (default: what the scheduler planned)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="CPU slots for compiles across all steps (default: this machine's usable CPUs: "
        "its affinity and cgroup CPU quota)",
    )
    p.add_argument(
        "--mem-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="memory all compiles together may use (default: available memory minus a margin)",
    )
    p.add_argument(
        "--compiler-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="ccache folder (default: <cache>/ccache; a volume for the Docker runner)",
    )
    p.add_argument("--no-compiler-cache", action="store_true", help="compile without ccache")
    p.add_argument(
        "--compiler-cache-backend",
        choices=("ccache", "sccache"),
        default=os.environ.get("KILN_COMPILER_CACHE_BACKEND") or None,
        help="ccache (default) or sccache (implied by --distribute and s3:// or gha:// stores)",
    )
    p.add_argument(
        "--cache-store",
        default=os.environ.get("KILN_CACHE_STORE") or None,
        metavar="URL",
        help="a compiler cache shared by builders: redis://HOST:PORT or http:// (ccache, "
        "sccache), s3://BUCKET/PREFIX[?endpoint=URL] or gha:// (sccache), or a folder; "
        "credentials from the environment (default: $KILN_CACHE_STORE)",
    )
    p.add_argument(
        "--distribute",
        default=os.environ.get("KILN_DISTRIBUTE") or None,
        metavar="URL",
        help="send compiles to this sccache-dist scheduler (token: $KILN_DIST_TOKEN; "
        "default: $KILN_DISTRIBUTE)",
    )
    p.add_argument(
        "--artifact-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="the cache of verified outputs by input hash (default: <cache>/artifacts)",
    )
    p.add_argument(
        "--no-artifact-cache",
        action="store_true",
        help="rebuild every vendor even when its inputs are unchanged",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for another build using the same artifacts/ or work folder (default: refuse)",
    )
    p.add_argument(
        "--learned-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="start from another build's learned unit times and memory: a release's "
        "manifest.json or a learned.json (default: the workspace's learned.json, if any)",
    )
    p.add_argument(
        "--save-learned",
        action="store_true",
        help="write what this build learned into the workspace's learned.json",
    )


def _options(args: argparse.Namespace, vendors: list[str] | None) -> Options:

    mirrors, offline = args.mirrors, args.offline
    if args.bundles is not None:
        from kiln.sources.bundles import mirrors_from_bundles

        mirrors = mirrors_from_bundles(
            args.workspace, args.bundles, args.work / "mirrors-from-bundles"
        )
        offline = True
    return Options(
        workspace=args.workspace,
        vendors=tuple(vendors) if vendors else None,
        profile=args.profile,
        artifacts=args.artifacts,
        cache=args.cache,
        work=args.work,
        mirrors=mirrors,
        offline=offline,
        python=args.python,
        cuda_home=args.cuda_home,
        runner=args.runner,
        image=args.image,
        allow_unpinned_image=args.allow_unpinned_image,
        docker_dir=args.docker_dir,
        docker_mounts=tuple(args.docker_mount),
        mem_limit_gib=args.mem_limit,
        toolchain=args.toolchain,
        jobs=args.jobs,
        mem_budget_gib=args.mem_budget,
        compiler_cache=args.compiler_cache,
        no_compiler_cache=args.no_compiler_cache,
        cache_backend=getattr(args, "compiler_cache_backend", None),
        cache_store=getattr(args, "cache_store", None),
        distribute=getattr(args, "distribute", None),
        artifact_cache=not args.no_artifact_cache,
        artifact_cache_dir=args.artifact_cache,
        wait=args.wait,
        keep_container=args.keep_container,
        learned_from=args.learned_from,
        save_learned=args.save_learned,
    )


def cmd_build(args: argparse.Namespace) -> int:
    from kiln.build import pipeline

    if args.json and not args.dry_run:
        raise KilnError("build --json: only with --dry-run (a build prints its release folder)")
    if args.dry_run:
        from kiln.build import dryrun
        from kiln.errors import PreflightError

        plan = dryrun.plan(_options(args, args.vendor or None))
        out(dryrun.as_json(plan) if args.json else dryrun.render(plan))
        return PreflightError.exit_code if plan["problems"] else 0
    release = pipeline.build(_options(args, args.vendor or None))
    out(release)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from kiln import demo
    from kiln.build import pipeline

    opts = _options(args, None)
    mirrors = demo.prepare(args.workspace, opts.work / "demo-upstreams")
    release = pipeline.build(replace(opts, mirrors=mirrors, offline=True))
    out(release)
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from kiln import lock
    from kiln.config.mirrors import Mirrors
    from kiln.config.workspace import Workspace
    from kiln.sources.checkout import GitCache

    ws = Workspace(args.workspace)
    cache = GitCache(args.cache, Mirrors.load(args.mirrors), args.offline)
    for line in lock.lock(ws, cache):
        out(line)
    return 0


def cmd_rebuild_c(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.rebuild_c import rebuild_c
    from kiln.toolchain.checks import find_cuda_home

    ws = Workspace(args.workspace)
    ccache_dir = None if args.no_compiler_cache else (args.compiler_cache or args.cache / "ccache")
    took, objects = rebuild_c(
        ws,
        args.tree,
        args.patch,
        args.python,
        str(find_cuda_home(args.cuda_home)),
        ccache_dir.resolve() if ccache_dir else None,
    )
    archs = sorted({a for o in objects for a in o.sass})
    out(f"rebuilt {', '.join(o.path for o in objects)} ({', '.join(archs)}) in {took:.1f} s")
    return 0


def cmd_pack_jit_cache(args: argparse.Namespace) -> int:
    from kiln.jit_cache import pack_into_release

    out(pack_into_release(args.cache_dir, args.name, args.release))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import tempfile

    from kiln import reproduce as reverify
    from kiln.release import manifest

    data = manifest.read(args.manifest)
    if args.rebuilt:
        rebuilt = args.rebuilt
    else:
        work = args.into or Path(tempfile.mkdtemp(prefix="kiln-verify-"))
        opts = replace(_options(args, None), work=work.resolve())
        rebuilt = reverify.rebuild(args.manifest, opts)
    report = reverify.compare(data, args.manifest.parent, rebuilt)
    if report:
        say_err("\n".join(report))
        say_err(f"verify: {args.manifest.parent} is NOT reproduced by {rebuilt}")
        return 1
    out(f"verify: every file of {args.manifest.parent} is reproduced bit for bit ({rebuilt})")
    return 0


def cmd_manifest_check(args: argparse.Namespace) -> int:
    from kiln.release import manifest

    problems = manifest.check(args.manifest)
    for p in problems:
        say_err(f"{p.path}: {p.problem}")
    if problems:
        say_err(f"{args.manifest}: {len(problems)} file(s) differ from the manifest")
        return 1
    out(f"{args.manifest}: every file matches")
    return 0


def cmd_manifest_schema(args: argparse.Namespace) -> int:
    from kiln.release import manifest

    out(manifest.schema_text().rstrip("\n"))
    return 0


def cmd_manifest_merge(args: argparse.Namespace) -> int:
    from kiln import merge

    merged = merge.merge(args.partials, args.out, args.workspace)
    out(f"merged {len(args.partials)} partial(s) into {merged}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.plan import matrix

    ws = Workspace(args.workspace)
    if args.release_name:
        out(ws.release.name)
    else:
        out(matrix.plan_json(ws) if args.json else matrix.plan_table(ws))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from kiln import publish

    out(publish.publish(args.release, args.to, args.dry_run, force=args.force))
    return 0


def cmd_gpu_test(args: argparse.Namespace) -> int:
    from kiln import gpu_test as gputest
    from kiln.config.mirrors import Mirrors
    from kiln.sources.checkout import GitCache

    mirrors, offline = args.mirrors, args.offline
    if args.bundles is not None:
        from kiln.sources.bundles import mirrors_from_bundles

        mirrors = mirrors_from_bundles(args.workspace, args.bundles, args.work / "gpu-test-mirrors")
        offline = True
    cache = GitCache(args.cache, Mirrors.load(mirrors), offline)
    results = gputest.gpu_test(args.release, args.vendor or None, args.python, cache)
    for r in results:
        verdict = "passed" if r["passed"] else f"FAILED (exit {r['returncode']})"
        out(
            f"gpu-test {r['vendor']}: {verdict} in {r['duration_s']} s on {r['gpus'][0]['name']} "
            f"({args.release / gputest.RESULTS_DIR / (r['vendor'] + '.json')})"
        )
    failed = [r["vendor"] for r in results if not r["passed"]]
    if failed:
        raise GpuTestError(f"the GPU test of {', '.join(failed)} failed: see its log")
    return 0


def cmd_verify_wheel(args: argparse.Namespace) -> int:
    from kiln.config.workspace import Workspace
    from kiln.verify import wheels as wheelcheck
    from kiln.verify_wheel import verify_release

    if args.manifest:
        lines = verify_release(args.manifest)
    else:
        if not args.wheels:
            raise KilnError("verify-wheel: name the wheel(s), or a release's --manifest")
        ws = Workspace(args.workspace)
        archs = wheelcheck.expected_archs(ws, args.vendor, args.archs)
        lines = wheelcheck.verify_wheels(args.wheels, ws.profile, archs)
    out("\n".join(lines) if lines else "verify-wheel: no wheels")
    return 0


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the epilog's lines as written."""


EXAMPLES = """\
examples:
  kiln demo                                  the bundled example, offline (CUDA from PyPI)
  kiln build --dry-run                       what a build would do: cache hits, fetches, jobs
  kiln build NAME --runner docker            one upstream in the builder image
  kiln build --workspace examples/public --bundles ../shared/upstreams
  kiln verify artifacts/REL/manifest.json    rebuild elsewhere, compare every file
  kiln manifest check artifacts/REL/manifest.json
  kiln publish artifacts/REL --to hf://ORG/NAME --dry-run
"""


def _exit_codes() -> str:
    from kiln.errors import table

    rows = [f"  {code:>3}  {name}: {what}" for code, name, what in table()]
    return "exit codes:\n" + "\n".join(rows) + "\n"


def _common() -> argparse.ArgumentParser:
    """-v/-q, accepted before the command and after it (SUPPRESS: a subcommand's absent
    flag does not undo the one given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also show every command kiln runs (debug logging)",
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="only warnings and errors",
    )
    return common


def parser() -> argparse.ArgumentParser:
    from kiln import version_line

    common = _common()
    ap = argparse.ArgumentParser(
        prog="kiln",
        description="kiln: reproducible builds of CUDA wheels from pinned upstream sources. "
        "A workspace (kiln.toml, vendors/, patches/) goes in; a release folder with a "
        "manifest that records how every byte was made comes out.",
        epilog=EXAMPLES + "\n" + _exit_codes(),
        formatter_class=_Help,
        parents=[common],
    )
    ap.add_argument("--version", action="version", version=version_line())
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, **kw: object) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, parents=[common], formatter_class=_Help, **kw
        )

    p = command("build", "build vendors of a workspace into a release folder")
    _add_build_args(p)
    p.add_argument("vendor", nargs="*", help="vendor names (default: every vendor)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="say what the build would do (cache hits and misses and why, what would be "
        "fetched, jobs, threads and memory) and build nothing",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.set_defaults(func=cmd_build)

    p = command("demo", "the full pipeline over the bundled example, offline")
    _add_build_args(p, workspace="examples/demo")
    p.set_defaults(func=cmd_demo, toolchain="pypi")

    p = command("lock", "resolve short SHAs, record submodule and patch hashes (network)")
    p.add_argument("--workspace", type=Path, default=Path("."), help="(default: .)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"(default: {DEFAULT_CACHE})")
    p.add_argument("--mirrors", type=Path, default=None, help="URL mirrors file (default: none)")
    p.add_argument("--offline", action="store_true", help="only the cache and local mirrors")
    p.set_defaults(func=cmd_lock)

    p = command("rebuild-c", "re-apply a patch to an installed tree, rebuild its extension")
    p.add_argument("tree", type=Path, help="the installed tree (the folder install.sh unpacked)")
    p.add_argument(
        "patch",
        nargs="?",
        default=None,
        help="a patch file, or a name under patches/ (default: the vendor's last)",
    )
    p.add_argument("--workspace", type=Path, default=Path("."), help="(default: .)")
    p.add_argument(
        "--python",
        default=None,
        help="the Python with torch (default: the one install.sh recorded)",
    )
    p.add_argument(
        "--cuda-home", default=None, help="(default: $CUDA_HOME, nvcc on PATH, /usr/local/cuda)"
    )
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"(default: {DEFAULT_CACHE})")
    p.add_argument(
        "--compiler-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="ccache folder, shared with build (default: <cache>/ccache)",
    )
    p.add_argument("--no-compiler-cache", action="store_true", help="compile without ccache")
    p.set_defaults(func=cmd_rebuild_c)

    p = command("pack-jit-cache", "pack a GPU run's JIT caches into a release")
    p.add_argument(
        "cache_dir", type=Path, help="folder holding the caches kiln.toml's jit_caches name"
    )
    p.add_argument("--name", required=True, help="label: jit-cache/jit-cache-<name>.tar.zst")
    p.add_argument(
        "--release",
        type=Path,
        default=None,
        help="release folder (default: artifacts/<release name of ./kiln.toml>)",
    )
    p.set_defaults(func=cmd_pack_jit_cache)

    p = command("verify", "rebuild a release from its manifest and compare every file")
    _add_build_args(p)
    p.add_argument("manifest", type=Path, help="the release's manifest.json")
    p.add_argument(
        "--into",
        type=Path,
        default=None,
        help="folder for the rebuild (default: a new temporary folder)",
    )
    p.add_argument(
        "--rebuilt",
        type=Path,
        default=None,
        help="compare against this earlier rebuild instead of building again",
    )
    p.set_defaults(func=cmd_verify)

    p = command("manifest", "manifest tools: check, schema, merge")
    msub = p.add_subparsers(dest="manifest_command", required=True, metavar="TOOL")
    c = msub.add_parser("check", help="re-hash every file a manifest lists", parents=[common])
    c.add_argument("manifest", type=Path, help="the release's manifest.json")
    c.set_defaults(func=cmd_manifest_check)
    c = msub.add_parser(
        "schema", help="print the manifest's JSON Schema (made from its models)", parents=[common]
    )
    c.set_defaults(func=cmd_manifest_schema)
    c = msub.add_parser(
        "merge", help="merge partial release folders (CI jobs) into one release", parents=[common]
    )
    c.add_argument("partials", nargs="+", type=Path, help="partial release folders")
    c.add_argument("--out", type=Path, required=True, help="the merged release folder")
    c.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="also require the partials to cover exactly this workspace's vendors and "
        "profile (default: no such check)",
    )
    c.set_defaults(func=cmd_manifest_merge)

    p = command("plan", "the CI matrix: one job per vendor x profile")
    p.add_argument("--workspace", type=Path, default=Path("."), help="(default: .)")
    p.add_argument("--json", action="store_true", help='{"include": [...]} for fromJSON')
    p.add_argument("--release-name", action="store_true", help="print the release's name only")
    p.set_defaults(func=cmd_plan)

    p = command("publish", "check a release, then put it into a folder or a Hub repository")
    p.add_argument("release", type=Path, help="the release folder (holds manifest.json)")
    p.add_argument("--to", required=True, help="a folder, file:///PATH, or hf://ORG/NAME")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded")
    p.add_argument(
        "--force",
        action="store_true",
        help="publish into a target whose files kiln did not write (default: refuse)",
    )
    p.set_defaults(func=cmd_publish)

    p = command("gpu-test", "run the upstreams' own GPU tests against a release's wheels")
    p.add_argument("release", type=Path, help="the release folder (holds manifest.json)")
    p.add_argument("vendor", nargs="*", help="vendors to test (default: all that declare one)")
    p.add_argument(
        "--python",
        default=sys.executable,
        help="the Python whose torch (with CUDA) the test environment builds on "
        "(default: this one)",
    )
    p.add_argument("--workspace", type=Path, default=Path("."), help="for --bundles (default: .)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"(default: {DEFAULT_CACHE})")
    p.add_argument("--work", type=Path, default=Path("build/work"), help="(default: build/work)")
    p.add_argument("--mirrors", type=Path, default=None, help="URL mirrors file (default: none)")
    p.add_argument("--offline", action="store_true", help="only the cache and local mirrors")
    p.add_argument(
        "--bundles", type=Path, default=None, metavar="DIR", help="upstreams from git bundles"
    )
    p.set_defaults(func=cmd_gpu_test)

    p = command("verify-wheel", "verify wheels built elsewhere (cibuildwheel)")
    p.add_argument("wheels", nargs="*", type=Path, help="the wheels")
    p.add_argument("--workspace", type=Path, default=Path("."), help="(default: .)")
    p.add_argument(
        "--vendor",
        default=os.environ.get("KILN_VENDOR") or None,
        help="expect this vendor's recipe archs (default: $KILN_VENDOR, else the profile's)",
    )
    p.add_argument(
        "--archs", nargs="+", default=None, help="expect exactly these SASS archs (default: none)"
    )
    p.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="verify every wheel a release lists, against its recipe and the record",
    )
    p.set_defaults(func=cmd_verify_wheel)
    return ap


def _fail(err: KilnError) -> int:
    """The one error report: a line on stderr (and a GitHub Actions annotation there)."""
    from kiln.build import github

    say_err(f"kiln: error: {err}")
    github.annotate_error(str(err), f"kiln: {type(err).__name__} (exit {err.exit_code})")
    return err.exit_code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    # -v is kiln's own debug output (every command it runs), not its libraries': they
    # stay at INFO (cyclonedx alone logs some 800 DEBUG lines while it is imported).
    logging.basicConfig(
        level=logging.WARNING if getattr(args, "quiet", False) and not verbose else logging.INFO,
        format="kiln: %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(logging.DEBUG if verbose else logging.NOTSET)
    os.umask(0o022)  # zip member modes follow the umask
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return _fail(Interrupted("interrupted: nothing was published; partial output was removed"))
    except KilnError as err:
        return _fail(err)
    except OSError as exc:
        from kiln import fsutil

        full = fsutil.disk_full(exc, Path(exc.filename or "."))
        if full is None:
            raise
        return _fail(full)
