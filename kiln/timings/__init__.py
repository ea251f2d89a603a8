"""A build's timings as pictures (issue 25): its records (``records``) laid onto slot
lanes (``slots``), written as Chrome/Perfetto trace-event JSON (``trace``) and as one
self-contained HTML page of SVG (``html``). ``kiln build --timings`` and ``kiln timings``
both call :func:`write`. docs/timings.md says what the page shows."""

from __future__ import annotations

import json
from pathlib import Path

from kiln import fsutil
from kiln.timings import html, slots, trace
from kiln.timings.records import Timeline

HTML_NAME = "timings.html"
TRACE_NAME = "timings.trace.json"


def write(timeline: Timeline, out: Path) -> tuple[Path, Path]:
    """``timings.html`` and ``timings.trace.json`` in ``out``, each whole or not at all."""
    assigned = slots.assign(timeline.units)
    data = trace.build(timeline, assigned)
    page = html.render(timeline, assigned)
    trace_file, html_file = out / TRACE_NAME, out / HTML_NAME
    fsutil.write_atomic(trace_file, json.dumps(data, indent=None, separators=(",", ":")))
    fsutil.write_atomic(html_file, page)
    return html_file, trace_file
