"""The admin ``Locks`` page: active holders of every backend, and force release.

Anchored on the unmanaged :class:`~django_distlock.models.Lock` model (no
table), so it sits under the app in the admin index and uses the normal
permissions: ``view_lock`` to see the page, ``release_lock`` to
force-release. The pages are built like django-constance's: ``get_urls()``,
``admin_site.each_context(request)`` and a ``TemplateResponse``.

Holders come straight from the backends (``holders()``), in the order the
backend lists them (Redis: SCAN order). A page shows ``list_per_page`` of
them and the total, counted up to ``full_result_count_limit`` holders
(beyond, "more than" that): counting reads the holders past the page, so the
limit keeps a page's cost bounded with 100,000 holders. Set
``show_full_result_count = False`` on a subclass to read only as far as the
page. A search reads every holder of the filtered backends (a full SCAN on
Redis) to find its matches.

The search, the backend filter and the page survive a force-release: the
changelist form carries them to the confirmation page as
``_changelist_filters`` (the admin's own name for them), and both its cancel
link and the redirect after the release return to the same list.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import csrf_protect_m
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .backends.base import Holder, Kind
from .backends.holders import visible_name
from .exceptions import LockError
from .handler import locks
from .models import Lock

__all__ = ["LockAdmin"]

SEARCH_VAR = "q"
BACKEND_VAR = "backend"
PAGE_VAR = "p"
REF_VAR = "ref"
SIGNING_SALT = "django_distlock.admin.release"
#: A reference to a listed lease is valid for this long (seconds).
REF_MAX_AGE = 3600


#: The query parameters of the changelist that a release carries back.
FILTERS_VAR = "_changelist_filters"
#: The longest name shown on hover (the ``title``): a name may be 1 MB long.
TITLE_WIDTH = 1000


def _display_name(name: str, width: int = 200) -> str:
    return Truncator(name).chars(width)


def _preserved(raw: str) -> str:
    """Return ``raw`` reduced to the changelist's own query parameters."""
    given = QueryDict(raw)
    kept = {k: given[k] for k in (SEARCH_VAR, BACKEND_VAR, PAGE_VAR) if given.get(k)}
    return urlencode(kept)


class _Row:
    """One holder as the changelist shows it."""

    def __init__(self, holder: Holder, now: float, can_release: bool):
        self.holder = holder
        self.name = visible_name(_display_name(holder.name))
        self.full_name = _display_name(holder.name, TITLE_WIDTH)
        self.backend = holder.backend
        self.host, self.pid, self.thread = holder.host, holder.pid, holder.thread
        self.acquired_at = holder.acquired_at
        self.expires_in = (
            max(0.0, holder.expires_at.timestamp() - now) if holder.expires_at else None
        )
        self.fencing_token = holder.fencing_token
        #: "exclusive", "shared" or "permit of N".
        self.kind = str(holder.kind)
        # Only users who may release get a reference to the lease (it carries
        # the token, signed but readable).
        self.ref = make_ref(holder) if can_release else None


def make_ref(holder: Holder) -> str:
    """Return a signed reference to exactly this lease, for the release form."""
    return signing.dumps(
        {
            "b": holder.backend,
            "n": holder.name,
            "t": holder.token,
            "h": holder.holder,
            "f": holder.fencing_token,
            "k": holder.kind.mode,
            "l": holder.kind.limit,
        },
        salt=SIGNING_SALT,
        compress=True,
    )


def read_ref(ref: str) -> dict[str, Any]:
    """Return the lease a reference names; raise signing.BadSignature if forged."""
    return signing.loads(ref, salt=SIGNING_SALT, max_age=REF_MAX_AGE)


@admin.register(Lock)
class LockAdmin(admin.ModelAdmin):
    """The ``Locks`` changelist and its force-release confirmation page."""

    change_list_template = "admin/django_distlock/change_list.html"
    release_confirmation_template = "admin/django_distlock/release_confirmation.html"
    list_per_page = 100
    #: Show the total. Counting reads the holders past the page, so it
    #: stops at ``full_result_count_limit`` ("of more than 10,000"): a page
    #: stays bounded however many locks are held.
    show_full_result_count = True
    full_result_count_limit = 10_000

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        """Return True if the user may force-release locks."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.release_lock")

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="{}_{}_changelist".format(*info),
            ),
            path(
                "release/",
                self.admin_site.admin_view(self.release_view),
                name="{}_{}_release".format(*info),
            ),
        ]

    # -- listing -------------------------------------------------------------

    def _holders(
        self, backend_filter: str | None, query: str, notes: list[str]
    ) -> Iterator[Holder]:
        needle = query.casefold()
        for alias in locks.settings:
            if backend_filter and alias != backend_filter:
                continue
            try:
                for holder in locks[alias].holders():
                    if not needle or needle in holder.name.casefold():
                        yield holder
            except (LockError, OSError) as exc:
                notes.append(
                    _("Backend %(alias)s could not be read: %(error)s")
                    % {"alias": alias, "error": exc}
                )

    @csrf_protect_m
    def changelist_view(self, request: HttpRequest, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get(SEARCH_VAR, "").strip()
        backend = request.GET.get(BACKEND_VAR) or None
        aliases = list(locks.settings)
        if backend not in aliases:
            backend = None
        try:
            page = max(1, int(request.GET.get(PAGE_VAR, 1)))
        except ValueError:
            page = 1
        per_page = self.list_per_page
        start = (page - 1) * per_page
        notes: list[str] = []
        can_release = self.has_release_permission(request)
        now = time.time()
        rows: list[_Row] = []
        has_next = False
        seen = 0
        counting = self.show_full_result_count
        limit = max(start + per_page, self.full_result_count_limit)
        more = False
        for holder in self._holders(backend, query, notes):
            if seen >= start + per_page:
                has_next = True
                if not counting:
                    break
                if seen >= limit:
                    more = True
                    break
            elif seen >= start:
                rows.append(_Row(holder, now, can_release))
            seen += 1
        total = seen if counting else None

        def url_with(**changes) -> str:
            params = {SEARCH_VAR: query, BACKEND_VAR: backend or "", PAGE_VAR: page}
            params.update(changes)
            clean = {k: v for k, v in params.items() if v not in ("", None, 1)}
            return "?" + urlencode(clean) if clean else "?"

        backend_choices = [
            {
                "label": _("All"),
                "url": url_with(**{BACKEND_VAR: "", PAGE_VAR: 1}),
                "selected": backend is None,
            }
        ] + [
            {
                "label": alias,
                "url": url_with(**{BACKEND_VAR: alias, PAGE_VAR: 1}),
                "selected": alias == backend,
            }
            for alias in aliases
        ]
        opts = self.opts
        context = {
            **self.admin_site.each_context(request),
            "title": _("Active locks"),
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "rows": rows,
            "notes": notes,
            "query": query,
            "backend": backend,
            "backend_choices": backend_choices,
            "page": page,
            "total": total,
            "total_is_more": more,
            "preserved_filters": _preserved(request.GET.urlencode()),
            "filters_var": FILTERS_VAR,
            "first_index": start + 1,
            "last_index": start + len(rows),
            "previous_url": url_with(**{PAGE_VAR: page - 1}) if page > 1 else None,
            "next_url": url_with(**{PAGE_VAR: page + 1}) if has_next else None,
            "can_release": can_release,
            "search_var": SEARCH_VAR,
            "backend_var": BACKEND_VAR,
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_list_template, context)

    # -- force release -------------------------------------------------------

    @csrf_protect_m
    def release_view(self, request: HttpRequest):
        """Confirm, then force-release the selected leases (POST only)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_release_permission(request):
            raise PermissionDenied
        preserved = _preserved(request.POST.get(FILTERS_VAR, ""))
        changelist = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
            current_app=self.admin_site.name,
        )
        if preserved:
            changelist += "?" + preserved
        refs = request.POST.getlist(REF_VAR)
        leases = []
        for ref in refs:
            try:
                lease = read_ref(ref)
            except signing.BadSignature:
                raise PermissionDenied from None
            lease["ref"] = ref
            lease["display_name"] = _display_name(lease["n"])
            # References made before kinds existed name exclusive leases.
            lease["kind"] = Kind(lease.get("k", "exclusive"), lease.get("l"))
            leases.append(lease)
        if not leases:
            self.message_user(
                request, _("Select at least one lock to release."), messages.WARNING
            )
            return HttpResponseRedirect(changelist)
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": _("Are you sure?"),
                "subtitle": None,
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "leases": leases,
                "ref_var": REF_VAR,
                "changelist_url": changelist,
                "preserved_filters": preserved,
                "filters_var": FILTERS_VAR,
            }
            request.current_app = self.admin_site.name
            return TemplateResponse(
                request, self.release_confirmation_template, context
            )
        released = skipped = 0
        for lease in leases:
            alias, name = lease["b"], lease["n"]
            try:
                kind = lease["kind"]
                # The kind only where it matters: one holder of a shared lock
                # or one permit; a backend offering exclusive locks alone may
                # not take it.
                args = (
                    (name, lease["t"]) if kind.exclusive else (name, lease["t"], kind)
                )
                done = alias in locks.settings and locks[alias].force_release(*args)
            except (LockError, OSError) as exc:
                self.message_user(
                    request,
                    _("Backend %(alias)s could not be reached: %(error)s")
                    % {"alias": alias, "error": exc},
                    messages.ERROR,
                )
                continue
            if not done:
                skipped += 1
                continue
            released += 1
            # A change, not a deletion: the lock still exists and can be
            # taken again; its holder lost it.
            self.log_change(
                request,
                Lock(name=_display_name(name, 200)),
                (
                    _(
                        "Force-released lock %(name)s on backend %(alias)s "
                        "(holder %(holder)s, fencing token %(fence)s)."
                    )
                    if kind.exclusive
                    else _(
                        "Force-released one holder (%(kind)s) of %(name)s on "
                        "backend %(alias)s (holder %(holder)s, fencing token "
                        "%(fence)s)."
                    )
                )
                % {
                    "name": repr(_display_name(name, 100)),
                    "alias": repr(alias),
                    "kind": kind,
                    "holder": lease["h"],
                    "fence": lease["f"],
                },
            )
        if released:
            self.message_user(
                request,
                ngettext(
                    "Released %(count)d lock.", "Released %(count)d locks.", released
                )
                % {"count": released},
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d lock was already released or taken again; "
                    "it was left alone.",
                    "%(count)d locks were already released or taken again; "
                    "they were left alone.",
                    skipped,
                )
                % {"count": skipped},
                messages.WARNING,
            )
        return HttpResponseRedirect(changelist)
