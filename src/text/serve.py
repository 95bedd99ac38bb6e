"""Scoring web page (seed 003's UI): type text, see every output score and the overall; Flag appends
the text and its scores to a CSV. Standard library only (http.server), one small HTML page.

Routes: GET / (the page), POST /score {"fields": {name: text}} -> {"scores": {output: value}},
POST /flag (same body) -> scores again, appended to the flag CSV with a UTC timestamp.
"""
from __future__ import annotations

import csv
import html
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from src.text.scorer import TextScorer

MAX_TEXT_CHARS = 20000

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Empathy scorer</title>
<style>body{{font-family:sans-serif;max-width:46rem;margin:2rem auto}}textarea{{width:100%;height:6rem}}
td,th{{padding:.2rem .8rem;text-align:left}}#status{{color:#555}}</style></head>
<body><h1>Empathy scorer</h1>
<form id="form">{inputs}
<button type="submit" id="submit">Submit</button> <button type="button" id="clear">Clear</button>
<button type="button" id="flag" disabled>Flag</button></form>
<table id="scores"><tr><th>output</th><th>score</th></tr>{rows}</table>
<p id="status"></p>
<script>
const fields = {fields_json};
function body() {{ const f = {{}}; for (const n of fields) f[n] = document.getElementById('field-' + n).value; return JSON.stringify({{fields: f}}); }}
async function send(path) {{
  const r = await fetch(path, {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: body()}});
  const data = await r.json();
  if (!r.ok) {{ document.getElementById('status').textContent = data.error; return null; }}
  for (const [k, v] of Object.entries(data.scores)) document.getElementById('score-' + k).textContent = v.toFixed(3);
  return data;
}}
document.getElementById('form').addEventListener('submit', async (e) => {{ e.preventDefault();
  if (await send('/score')) {{ document.getElementById('flag').disabled = false; document.getElementById('status').textContent = 'scored'; }} }});
document.getElementById('flag').addEventListener('click', async () => {{
  if (await send('/flag')) document.getElementById('status').textContent = 'flagged'; }});
document.getElementById('clear').addEventListener('click', () => {{ for (const n of fields) document.getElementById('field-' + n).value = '';
  document.querySelectorAll('[id^=score-]').forEach(td => td.textContent = '-'); document.getElementById('flag').disabled = true; }});
</script></body></html>
"""


def render_page(scorer: TextScorer) -> str:
    inputs = "".join(f'<p><label for="field-{html.escape(f)}">{html.escape(f.replace("_", " "))}</label><br>'
                     f'<textarea id="field-{html.escape(f)}" name="{html.escape(f)}"></textarea></p>' for f in scorer.fields)
    rows = "".join(f'<tr><td>{html.escape(o)}</td><td id="score-{html.escape(o)}">-</td></tr>' for o in scorer.output_names)
    return PAGE.format(inputs=inputs, rows=rows, fields_json=json.dumps(scorer.fields))


class FlagLog:
    """Appends flagged texts and scores to a CSV (header written once), safe across request threads."""

    def __init__(self, path: Path, fields: list[str], outputs: list[str]):
        self.path, self.columns = Path(path), ["flagged_at", *fields, *outputs]
        self._lock = threading.Lock()

    def append(self, fields: dict[str, str], scores: dict[str, float]) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists() or self.path.stat().st_size == 0
            with self.path.open("a", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns)
                if new:
                    writer.writeheader()
                writer.writerow({"flagged_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **fields, **scores})


def make_server(scorer: TextScorer, host: str, port: int, flag_csv: str | Path) -> ThreadingHTTPServer:
    """A ready-to-serve server (port 0 picks a free port: see server.server_address)."""
    page = render_page(scorer).encode("utf-8")
    flags = FlagLog(Path(flag_csv), scorer.fields, scorer.output_names)
    lock = threading.Lock()  # one scoring at a time: the model is not re-entrant

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, data: dict) -> None:
            self._send(code, json.dumps(data).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path in ("/", "/index.html"):
                self._send(200, page, "text/html; charset=utf-8")
            else:
                self._json(404, {"error": f"no page {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/score", "/flag"):
                return self._json(404, {"error": f"no route {self.path}"})
            try:
                length = int(self.headers.get("Content-Length", 0))
                fields = json.loads(self.rfile.read(length) or b"{}").get("fields", {})
                texts = {f: str(fields.get(f, ""))[:MAX_TEXT_CHARS] for f in scorer.fields}
            except (ValueError, AttributeError) as error:
                return self._json(400, {"error": f"bad request: {error}"})
            if not texts[scorer.fields[0]].strip():
                return self._json(400, {"error": f"type some text in '{scorer.fields[0]}' first"})
            with lock:
                scores = {k: float(v[0]) for k, v in scorer.score({f: [t] for f, t in texts.items()}).items()}
            if self.path == "/flag":
                flags.append(texts, scores)
            self._json(200, {"scores": scores})

        def log_message(self, format: str, *args) -> None:  # quiet: no per-request stderr lines
            return

    return ThreadingHTTPServer((host, port), Handler)
