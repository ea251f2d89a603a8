"""The one table of build-failure causes kiln knows (:mod:`.table` tries the rows, in
order; the first that matches wins). Each row reads a failed step's first errors and,
when they are its kind, says the cause and the fix, with what the build really saw (the
header the include path resolved, the package and version it came from, the folders the
linker searched). Standard library only: it runs where the build ran.

The rows live by what failed:

- :mod:`.resources`: ``cannot_write``, ``disk_full``, ``killed`` (signal 9: most likely
  out of memory; the runner's own OOM message wins where its cgroup counted the kill);
- :mod:`.buildsetup`: ``setup_import`` (a module setup.py imports that the build venv
  lacks: a vendor's build tool, or no distribution at all);
- :mod:`.network`: ``network_download`` (the URL, and the switch that skips it);
- :mod:`.archs`: ``arch_refused`` (a unit kiln's arch rewrite would not compile for the
  build's archs: how to leave it out), ``arch_uncovered``, ``arch_dropped``,
  ``ptx_instruction``, ``unknown_arch`` (the CUDA release that has it);
- :mod:`.compile`: ``output_gone``, ``missing_header`` (the Debian/Ubuntu package or
  NVIDIA's pip wheel, and the ``[[build.system]]`` entry that makes preflight check it),
  ``cxx_standard``, ``missing_identifier`` (the header resolved, its package and version;
  pin a newer one);
- :mod:`.link`: ``missing_library`` (``cannot find -lX``: the package, where the linker
  looked) and ``undefined_symbol`` (the library that defines it, link and RUNPATH);
- :mod:`.load`, the table's second part (``LOAD_ROWS``): why a built module does not
  import where the release lands (the import proof): ``load_timeout``,
  ``load_missing_library``, ``load_abi_mismatch``, ``load_left_off_link``,
  ``load_never_compiled``, ``load_needs_gpu``, ``load_missing_module``,
  ``load_python_error``.

What the rows read and say is :mod:`.cause`; where things are, :mod:`.places`.
"""
