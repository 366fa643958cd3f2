"""Issue 32, Build 4: SIGHUP reads the receivers' HMAC ``secret_file``s again, as it does the
web config and the token file, so a rotated secret needs no restart."""

from __future__ import annotations

from exporter.advisor.webhook import sign, verify
from exporter.cli.serve import assemble, protection, reloaders
from exporter.config import Config, build


def test_sighup_reads_a_rotated_receiver_secret_and_keeps_the_last_good_one(tmp_path, caplog):
    secret = tmp_path / "hmac"
    secret.write_text("first-secret\n")
    config = build(Config, {"advisor": {
        "outbox": str(tmp_path / "outbox.sqlite"),
        "receivers": [{"name": "scheduler", "url": "http://127.0.0.1:9/plans",
                       "secret_file": str(secret)}]}})
    _, _, advisor = assemble(config, ["sim"])
    assert advisor is not None
    try:
        found = dict(reloaders(protection(config, advisor, None), advisor, config))
        assert set(found) == {"receiver_secrets"}
        (receiver,) = advisor.deliverer.receivers
        assert receiver.secret == b"first-secret"
        secret.write_text("rotated-secret\n")
        assert found["receiver_secrets"]() == "read"
        (receiver,) = advisor.deliverer.receivers
        body = b'{"plan_id": "p"}'
        assert verify(body, b"rotated-secret", sign(body, receiver.secret))
        secret.write_text("   \n")  # blank: the rotated secret is kept, and the reason logged
        caplog.set_level("WARNING", logger="exporter.advisor.service")
        assert found["receiver_secrets"]() == "1 kept"
        assert advisor.deliverer.receivers[0].secret == b"rotated-secret"
        assert "empty after stripping whitespace" in caplog.text
    finally:
        advisor.deliverer.store.close()
