"""``hookviz explore``: one model over your photos, looked around live in the browser (:mod:`.session`: the
views, made by ``gradcam``'s own job; :mod:`.server`: the page and the JSON API, private by default)."""

from hookviz.explore.session import Session
from hookviz.explore.view import Made, View

__all__ = ["Made", "Session", "View"]
