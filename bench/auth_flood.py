"""A flood of wrong passwords against a TLS + basic-auth exporter, beside a scraper whose
credentials are cached: does the flood starve the scrapes? (issue 14, Build 6)

Starts ``python -m exporter serve --web.config.file`` over TLS (certificates from
``openssl``, a bcrypt hash of cost 10, as htpasswd -nBC 10 makes), scrapes /metrics 20
times quietly, then runs ``wrk -t2 -c50 -d15s`` with a wrong password while scraping
every 0.2 s with the right one, and prints the scrapers' latencies and wrk's statuses::

    .venv/bin/python bench/auth_flood.py
"""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.servers import free_port, stop  # noqa: E402
from tests.helpers.tls import bcrypt_hash, make_pki  # noqa: E402

# wrk counts statuses per thread; done() sums them
COUNT_LUA = """local threads = {}
setup = function(thread) table.insert(threads, thread) end
init = function(args) statuses = {} end
response = function(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
done = function(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do total[k] = (total[k] or 0) + v end
  end
  for k, v in pairs(total) do io.write("status ", k, ": ", v, string.char(10)) end
end
"""


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def main() -> None:
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk is not installed (make bench-deps)")
    with tempfile.TemporaryDirectory(prefix="gpufleet-auth-flood-") as folder:
        tmp = Path(folder)
        pki = make_pki(tmp / "pki")
        web = tmp / "web.yml"
        web.write_text(f"tls_server_config:\n  cert_file: {pki.cert}\n  key_file: {pki.key}\n"
                       f"basic_auth_users:\n  prometheus: {bcrypt_hash('secret', 10)}\n")
        port = free_port()
        log = tmp / "exporter.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
             "--web.config.file", str(web)], cwd=tmp, stdout=log.open("w"),
            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            context = ssl.create_default_context(cafile=str(pki.ca))
            headers = {"Authorization": _basic("prometheus", "secret"), "Accept-Encoding": "gzip"}
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context,
                                                     timeout=30)

            def scrape() -> tuple[int, float]:
                started = time.perf_counter()
                connection.request("GET", "/metrics", headers=headers)
                response = connection.getresponse()
                response.read()
                return response.status, time.perf_counter() - started

            for _ in range(150):
                try:
                    if scrape()[0] == 200:
                        break
                except (OSError, http.client.HTTPException):
                    connection.close()
                time.sleep(0.2)
            quiet = [scrape()[1] for _ in range(20)]
            lua = tmp / "count.lua"
            lua.write_text(COUNT_LUA)
            flood = subprocess.Popen(
                [wrk, "-t2", "-c50", "-d15s", "--latency", "-s", str(lua),
                 "-H", f"Authorization: {_basic('prometheus', 'wrong')}",
                 f"https://127.0.0.1:{port}/metrics"], stdout=subprocess.PIPE, text=True)
            time.sleep(2)
            statuses, loaded = [], []
            end = time.monotonic() + 10
            while time.monotonic() < end:
                status, took = scrape()
                statuses.append(status)
                loaded.append(took)
                time.sleep(0.2)
            out = flood.communicate()[0]
        finally:
            stop(proc)
    print(f"quiet: {len(quiet)} scrapes, p50 {statistics.median(quiet) * 1000:.0f} ms, "
          f"max {max(quiet) * 1000:.0f} ms")
    print(f"during the flood: {len(loaded)} scrapes, statuses {sorted(set(statuses))}, "
          f"p50 {statistics.median(loaded) * 1000:.0f} ms, max {max(loaded) * 1000:.0f} ms")
    print(out)


if __name__ == "__main__":
    main()
