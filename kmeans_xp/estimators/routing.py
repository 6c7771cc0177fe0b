"""scikit-learn's metadata routing for KMeans, without scikit-learn at run time.

A meta-estimator (Pipeline, GridSearchCV, cross_validate) with
``sklearn.set_config(enable_metadata_routing=True)`` routes ``sample_weight`` to KMeans only
when asked with ``set_fit_request`` / ``set_score_request``, and reads the requests through
``get_metadata_routing``. Routing can only be enabled by importing scikit-learn, so these
methods import it and nothing else does.
"""
from __future__ import annotations

import sys

#: the metadata each routed method takes (sklearn's KMeans routes the same two)
ROUTED = {"fit": ("sample_weight",), "score": ("sample_weight",)}
#: sklearn.utils.metadata_routing.UNCHANGED: leave the request as it is
UNCHANGED = "$UNCHANGED$"


def routing_enabled() -> bool:
    """sklearn's enable_metadata_routing, False where scikit-learn was never imported."""
    sk = sys.modules.get("sklearn")
    return sk is not None and bool(sk.get_config().get("enable_metadata_routing", False))


class Requests(dict):
    """method -> {metadata: alias} as set by set_{method}_request. sklearn's clone copies an
    estimator's `_metadata_request` through `__sklearn_clone__`, so clones keep requests."""

    def __sklearn_clone__(self):
        return Requests({method: dict(r) for method, r in self.items()})


def _sklearn_request(owner, requests):
    """sklearn's MetadataRequest for these requests (its add_request checks the aliases)."""
    from sklearn.utils.metadata_routing import MetadataRequest
    request = MetadataRequest(owner=owner)
    for method, params in ROUTED.items():
        for param in params:
            # None, sklearn's default: an error if a meta-estimator is given the metadata
            alias = requests.get(method, {}).get(param)
            getattr(request, method).add_request(param=param, alias=alias)
    return request


class MetadataRouting:
    """Mixed into KMeans: the consumer side of sklearn's metadata routing."""

    def set_fit_request(self, *, sample_weight: bool | None | str = UNCHANGED):
        """Request metadata passed to ``fit`` by a meta-estimator (metadata routing on).

        Parameters
        ----------
        sample_weight : str, True, False, or None, default=sklearn.utils.metadata_routing.UNCHANGED
            True: pass ``sample_weight`` to ``fit``; False: do not; None: raise if given; a
            str: pass the metadata of that name as ``sample_weight``.

        Returns
        -------
        self : KMeans
            The estimator, its request updated.
        """
        return self._set_request("fit", sample_weight=sample_weight)

    def set_score_request(self, *, sample_weight: bool | None | str = UNCHANGED):
        """Request metadata passed to ``score`` by a meta-estimator (metadata routing on).

        Parameters
        ----------
        sample_weight : str, True, False, or None, default=sklearn.utils.metadata_routing.UNCHANGED
            As in `set_fit_request`, for ``score``.

        Returns
        -------
        self : KMeans
            The estimator, its request updated.
        """
        return self._set_request("score", sample_weight=sample_weight)

    def _set_request(self, method, **aliases):
        if not routing_enabled():
            raise RuntimeError(
                "This method is only available when metadata routing is enabled. You can "
                "enable it using sklearn.set_config(enable_metadata_routing=True).")
        old = getattr(self, "_metadata_request", None) or {}
        requests = Requests({m: dict(r) for m, r in old.items()})
        changed = {p: a for p, a in aliases.items()
                   if not (isinstance(a, str) and a == UNCHANGED)}
        requests[method] = {**requests.get(method, {}), **changed}
        _sklearn_request(type(self).__name__, requests)  # bad aliases raise here, as in sklearn
        self._metadata_request = requests
        return self

    def get_metadata_routing(self):
        """Get the metadata this estimator requests, as sklearn's meta-estimators read it.

        Returns
        -------
        routing : sklearn.utils.metadata_routing.MetadataRequest
            ``fit`` and ``score`` take ``sample_weight`` when requested.
        """
        return _sklearn_request(type(self).__name__,
                                getattr(self, "_metadata_request", None) or {})
