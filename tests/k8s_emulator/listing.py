"""LIST as the API server serves it from etcd: `limit`/`continue` pages of one consistent snapshot, and the
`resourceVersion`/`resourceVersionMatch` semantics of the API concepts page ("Semantics for get and list").

- Items come in etcd key order (`<namespace>/<name>`, or `<name>` for cluster-scoped kinds).
- `limit=N` returns at most N items and, when more match, `metadata.continue`: an opaque token naming the
  snapshot's revision and the key to start after (base64 of JSON, as kube-apiserver's). Every later page is read at
  that revision, so objects created, changed or deleted between pages do not show, and each page carries the first
  page's resourceVersion. `remainingItemCount` is set on a page with a token when the list has no selectors.
- The snapshot is rebuilt from the store's event history; once compacted past it (the history's bound, or the admin
  `compact` hook: etcd compacts every 5 minutes) the token is refused with 410 Expired, and the Status carries an
  inconsistent token that continues from the same key at the latest revision.
- `resourceVersion` without `limit` (or `resourceVersionMatch=NotOlderThan`, or "0") serves the latest state;
  `resourceVersionMatch=Exact`, or a non-zero `resourceVersion` with `limit`, serves the state at that revision
  (410 once compacted, 504 past the newest).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.selectors import Predicate

if TYPE_CHECKING:
    from tests.k8s_emulator.store import ObjectKey, Store

LIST_OPTIONS = "ListOptions.meta.k8s.io"
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")
EXPIRED_LIST = "The resourceVersion for the provided list is too old."
LATEST = -1  # a token's revision that means "the newest state" (the inconsistent continuation)


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None = None
    remaining: int | None = None

    def list_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": self.resource_version}
        if self.continue_token:
            meta["continue"] = self.continue_token
            if self.remaining is not None:
                meta["remainingItemCount"] = self.remaining
        return meta


def etcd_key(key: ObjectKey) -> str:
    namespace, name = key
    return f"{namespace}/{name}" if namespace else name


def encode_continue(rv: int, start_after: str) -> str:
    body = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start_after + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """(revision, the key to start at) of a token; a 400 for one this server did not make."""
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if body.get("v") != "meta.k8s.io/v1" or not isinstance(body.get("rv"), int):
            raise ValueError("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
        start = body["start"]
        if not isinstance(start, str) or not start:
            raise ValueError("encoded start key is empty")
    except (ValueError, binascii.Error, UnicodeDecodeError, TypeError, AttributeError, KeyError) as err:
        raise StatusError.bad_request(f"invalid continue token: continue key is not valid: {err}") from None
    return body["rv"], start


def list_page(store: Store, rt: ResourceType, namespace: str, predicate: Predicate, query: Any,
              has_selector: bool) -> Page:
    """The page of a LIST request: `query` its parameters, `predicate` its selectors."""
    limit, token, revision = _options(query)
    start = ""
    if token:
        revision, start = decode_continue(token)
    at = store.rv if revision is None or revision == LATEST else revision
    if at > store.rv:
        raise StatusError(504, "Timeout", f"Too large resource version: {at}, current: {store.rv}",
                          {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                           "retryAfterSeconds": 1})
    state = store.state_at(rt.key, at)
    if state is None:
        if token:  # the snapshot is compacted away: offer the rest of the list as it is now
            raise StatusError(410, "Expired", EXPIRED_CONTINUE,
                              list_meta={"continue": encode_continue(LATEST, start.rstrip("\x00"))})
        raise StatusError(410, "Expired", EXPIRED_LIST)
    keyed = sorted((etcd_key(k), obj) for k, obj in state.items() if not namespace or k[0] == namespace)
    matching = [(key, obj) for key, obj in keyed if key >= start and predicate(obj)]
    page = matching if limit is None else matching[:limit]
    items = [copy.deepcopy(obj) for _, obj in page]
    if limit is None or len(matching) <= limit:
        return Page(items, str(at))
    return Page(items, str(at), encode_continue(at, page[-1][0]),
                None if has_selector else len(matching) - limit)


def _options(query: Any) -> tuple[int | None, str, int | None]:
    """(limit or None, continue token, the revision to read at or None for the newest), validated as the API
    server validates ListOptions."""
    raw_limit, token = query.get("limit", ""), query.get("continue", "")
    version, match = query.get("resourceVersion", ""), query.get("resourceVersionMatch", "")
    try:
        limit = int(raw_limit) if raw_limit else 0
    except ValueError:
        raise StatusError.bad_request(f'strconv.ParseInt: parsing "{raw_limit}": invalid syntax') from None
    causes = []
    if match and not version:
        causes.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion "
                      "is provided")
    if match and token:
        causes.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided")
    if match == "Exact" and version == "0":
        causes.append('resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
                      'resourceVersion "0"')
    if match not in ("", "Exact", "NotOlderThan"):
        causes.append(f'resourceVersionMatch: Unsupported value: "{match}": supported values: "Exact", '
                      '"NotOlderThan"')
    if causes:
        raise StatusError.invalid(LIST_OPTIONS, "", causes)
    if token and version not in ("", "0"):
        raise StatusError.bad_request("specifying resource version is not allowed when using continue")
    exact = match == "Exact" or (not match and limit > 0 and version not in ("", "0"))
    return (limit if limit > 0 else None), token, (_revision(version) if exact else None)


def _revision(version: str) -> int:
    try:
        return int(version)
    except ValueError:
        raise StatusError.bad_request(f"invalid resource version: {version!r}") from None
