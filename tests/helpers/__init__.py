"""What tests share: the repository and its data, and real servers on 127.0.0.1.

``tests/conftest.py`` holds only fixtures; everything else a test imports comes
from here (``from tests.helpers import free_port``) or from a helper module
(``tests.helpers.alerting``, ``.slurm_cluster``, ``.fake_pynvml``, ...).
"""

from tests.helpers.data import REPO, data_dir, openb_csv
from tests.helpers.servers import (
    Prometheus,
    Server,
    free_port,
    http_get,
    require_binary,
    start_exporter,
    start_prometheus,
    start_server,
    stop,
    wait_http,
    wait_until,
)

__all__ = [
    "REPO", "Prometheus", "Server", "data_dir", "free_port", "http_get", "openb_csv",
    "require_binary", "start_exporter", "start_prometheus", "start_server", "stop", "wait_http",
    "wait_until",
]
