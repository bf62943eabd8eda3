"""core.tls: minted files are private, the contexts refuse what they should (no server here:
a handshake between two in-memory TLS objects)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from core.tls import TlsError, TlsFiles, from_settings
from tests.tls.certs import mint


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str = "127.0.0.1") -> None:
    """Drive one handshake between ``client`` and ``server`` through memory BIOs."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for key, obj in (("c", c), ("s", s)):
            if not done[key]:
                try:
                    obj.do_handshake()
                    done[key] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after its own Finished
            c.write(b"x")
            s_in.write(c_out.read())
            assert s.read(1) == b"x"
            return
    raise AssertionError("the handshake did not finish")


def test_minted_keys_are_private_and_the_chain_verifies(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    for f in (certs.ca.key, certs.server.key, certs.client.key, certs.server.cert):
        assert f.stat().st_mode & 0o777 == 0o600, f
    _handshake(certs.server.server_context(), certs.client.client_context())
    # a client of the SDK (the CA only, no certificate of its own) is let in by "optional"
    from core.tls import client_context

    _handshake(certs.server.server_context(), client_context(certs.ca.cert))


def test_a_client_certificate_from_another_ca_fails_the_handshake(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    stranger = TlsFiles(certs.stranger.cert, certs.stranger.key, certs.ca.cert)
    with pytest.raises(ssl.SSLError):
        _handshake(certs.server.server_context(), stranger.client_context())


def test_required_client_certificates_refuse_a_client_without_one(tmp_path: Path) -> None:
    from core.tls import client_context

    certs = mint(tmp_path)
    mtls = TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert, "required")
    _handshake(mtls.server_context(), certs.client.client_context())
    with pytest.raises(ssl.SSLError):
        _handshake(mtls.server_context(), client_context(certs.ca.cert))


def test_a_server_from_another_ca_or_name_is_not_trusted(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs.stranger.server_context(), certs.client.client_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs.server.server_context(), certs.client.client_context(), "node-b")


def test_contexts_refuse_tls_below_1_2(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    assert certs.server.server_context().minimum_version == ssl.TLSVersion.TLSv1_2
    assert certs.client.client_context().minimum_version == ssl.TLSVersion.TLSv1_2


def test_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    assert from_settings(None, None, None, "optional") is None
    with pytest.raises(TlsError, match="both"):
        from_settings(certs.server.cert, None, None, "optional")
    with pytest.raises(TlsError, match="does not exist"):
        from_settings(certs.server.cert, tmp_path / "nope.key", None, "optional")
    certs.server.key.chmod(0o644)
    with pytest.raises(TlsError, match="readable by others"):
        from_settings(certs.server.cert, certs.server.key, None, "optional")
    certs.server.key.chmod(0o600)
    with pytest.raises(TlsError, match="no CA"):
        from_settings(certs.server.cert, certs.server.key, None, "required")
