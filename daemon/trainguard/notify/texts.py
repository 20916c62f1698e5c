"""What each kind of finding says to a person, in their language.

Detectors write findings in English for logs and JSON. For people, each finding kind
has a renderer here that builds its texts from the finding's `details` and `labels`
(the facts, which do not depend on language) through the gettext catalog of the target's
language: a short fact for the title, what happened, why it matters, and the next step.
A kind without a renderer falls back to the detector's English summary and hint; a test
fails for every kind the code creates that has none (docs/i18n.md).
"""

from __future__ import annotations

import logging

from trainguard.i18n import Gettext
from trainguard.notify import texts_fs, texts_gpu, texts_ops, texts_run  # noqa: F401  (each registers its renderers)
from trainguard.notify.renderers import RENDERERS, Texts, plain
from trainguard.records import Finding

__all__ = ["RENDERERS", "Texts", "plain", "texts_for"]

log = logging.getLogger(__name__)


def texts_for(f: Finding, _: Gettext) -> Texts:
    renderer = RENDERERS.get(f.kind)
    if renderer is not None:
        try:
            return renderer(f, _)
        except (KeyError, TypeError, ValueError):
            pass  # a finding without the facts its renderer needs still gets its English text
        except Exception as exc:  # a renderer's own fault must not cost the alert its message
            log.warning("the %s message could not be written in full (%s: %s); sending its English summary",
                        f.kind, type(exc).__name__, exc)
    return Texts(fact=f.summary, subject=f.summary, what=f.summary, step=_(f.hint) if f.hint else "",
                 fallback=True)
