"""Tuning, in three subpackages by reason to change: ``search`` (where the next trial goes),
``measure`` (how a config is measured: runners, levels, scoring, trials, validation) and
``run`` (running a study: create, controllers, lanes, claims, recovery). The attribute codec
that all three read (``attrs``, ``study_attrs``) sits here
(docs/architecture.md#4-one-owner-per-stored-key)."""

__all__: list[str] = []
