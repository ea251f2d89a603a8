"""The verbs' engines, each above every stage it uses: ``add``, ``lock``
(:mod:`runtime_lock`), ``verify`` (:mod:`rebuild_check`), ``verify-wheel``
(:mod:`wheel_check`), ``gpu-test`` (:mod:`gpu_check`), ``manifest merge`` (:mod:`merge`),
``publish`` (:mod:`hub_publish`), ``pack-jit-cache`` (:mod:`jitcache`), ``rebuild-c``
(:mod:`rebuild_ext`) and ``demo`` (:mod:`demo_workspace`). ``build`` is the engine's own
(:mod:`kiln.orchestrate.pipeline`). Each verb's command line is in :mod:`kiln.commands`."""
