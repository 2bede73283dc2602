"""KubeAuth (TokenReview + SubjectAccessReview) against a stub client (each answer's shape without a cluster;
tests/api/test_cli.py has the real API server answer them), the token file parser, and the app's 403 from a
SubjectAccessReview denial; readiness before the cache syncs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flywheel.api.app import create_app
from flywheel.api.auth import ACCESS_REVIEWS, TOKEN_REVIEWS, Access, AuthConfigError, KubeAuth, Principal, TokenFileAuth
from tests.api.memory_source import MemorySource


class StubAuthn:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def create_token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        token = body["spec"]["token"]
        self.calls.append(token)
        if token == "good":
            return {"status": {"authenticated": True,
                               "user": {"username": "system:serviceaccount:ml:ci", "uid": "9", "groups": ["ml"]}}}
        return {"status": {"authenticated": False, "error": "invalid bearer token"}}


class StubAuthz:
    """Allows get/list anywhere and patch only in namespace "ml" (not on the scale subresource)."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []

    def create_subject_access_review(self, body: dict[str, Any]) -> dict[str, Any]:
        self.reviews.append(body["spec"])
        attrs = body["spec"]["resourceAttributes"]
        ok = (attrs["verb"] == "get" or (attrs["verb"] == "list" and attrs.get("namespace") != "secret")
              or (attrs.get("namespace") == "ml" and "subresource" not in attrs))
        return {"status": {"allowed": ok, **({} if ok else {"reason": "RBAC: no rule allows it"})}}


class StubKube:
    """The two review POSTs, as flywheel.kube.client.Kube.request sends them."""

    def __init__(self, authn: StubAuthn, authz: StubAuthz) -> None:
        self.authn, self.authz = authn, authz

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        assert method == "POST", method
        if path == TOKEN_REVIEWS:
            return self.authn.create_token_review(body)
        assert path == ACCESS_REVIEWS, path
        return self.authz.create_subject_access_review(body)


def test_token_review_and_subject_access_review() -> None:
    asyncio.run(_reviews())


async def _reviews() -> None:
    authn, authz = StubAuthn(), StubAuthz()
    auth = KubeAuth(StubKube(authn, authz))
    who = await auth.authenticate("good")
    assert who == Principal("system:serviceaccount:ml:ci", "9", ("ml",))
    assert await auth.authenticate("bad") is None and await auth.authenticate("bad") is None
    assert authn.calls == ["good", "bad"]  # both answers cached
    assert await auth.authorize(who, Access("patch", "ml", "j")) == (True, "")
    allowed, message = await auth.authorize(who, Access("patch", "ml", "j", "scale"))
    assert not allowed and message == ("user 'system:serviceaccount:ml:ci' may not patch trainingjobs/scale"
                                       ".flywheel.dev in namespace 'ml': RBAC: no rule allows it")
    assert authz.reviews[0] == {"user": "system:serviceaccount:ml:ci", "uid": "9", "groups": ["ml"],
                                "resourceAttributes": {"group": "flywheel.dev", "resource": "trainingjobs",
                                                       "verb": "patch", "namespace": "ml", "name": "j"}}
    await auth.authorize(who, Access("patch", "ml", "j"))
    assert len(authz.reviews) == 2  # cached decision


def test_kube_auth_drives_401_and_403_in_the_app() -> None:
    source = MemorySource()
    source.put("job", {"metadata": {"name": "j", "namespace": "ml"}, "spec": {}, "status": {"phase": "Running"}})
    source.put("job", {"metadata": {"name": "k", "namespace": "other"}, "spec": {}})
    app = create_app(source, KubeAuth(StubKube(StubAuthn(), StubAuthz())), actions=None)
    with TestClient(app) as http:
        good = {"Authorization": "Bearer good"}
        assert http.get("/v1/jobs", headers={"Authorization": "Bearer bad"}).status_code == 401
        assert [j["name"] for j in http.get("/v1/jobs", headers=good).json()["items"]] == ["j", "k"]
        hidden = http.get("/v1/jobs", params={"namespace": "secret"}, headers=good)
        assert hidden.status_code == 403 and "may not list trainingjobs.flywheel.dev in namespace 'secret'" in \
            hidden.json()["detail"]
        denied = http.post("/v1/jobs/other/k/suspend", headers=good)
        assert denied.status_code == 403 and "may not patch trainingjobs.flywheel.dev in namespace 'other'" in \
            denied.json()["detail"]
        read_only = http.post("/v1/jobs/ml/j/suspend", headers=good)  # allowed, but this server has no actions
        assert read_only.status_code == 501 and read_only.json()["reason"] == "NotImplemented"


def test_token_file_format_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text('# comment\nt1,alice,1\nt2,bob,2,"flywheel:viewers,x"\n')
    auth = TokenFileAuth.from_file(path)
    assert asyncio.run(auth.authenticate("t2")) == Principal("bob", "2", ("flywheel:viewers", "x"))
    assert asyncio.run(auth.authenticate("t3")) is None
    path.write_text("only-a-token\n")
    with pytest.raises(AuthConfigError, match="line 1: expected token,user"):
        TokenFileAuth.from_file(path)
    with pytest.raises(AuthConfigError, match="no tokens"):
        path.write_text("# nothing\n")
        TokenFileAuth.from_file(path)
    with pytest.raises(AuthConfigError, match="missing"):
        TokenFileAuth.from_file(tmp_path / "missing")


def test_readyz_is_503_until_the_cache_syncs() -> None:
    class Unsynced(MemorySource):
        def ready(self) -> bool:
            return False

    app = create_app(Unsynced(), TokenFileAuth({"t": Principal("a")}))
    with TestClient(app) as http:
        assert http.get("/readyz").status_code == 503
        resp = http.get("/v1/jobs/default/x", headers={"Authorization": "Bearer t"})
        assert resp.status_code == 503 and resp.json()["reason"] == "NotReady"
