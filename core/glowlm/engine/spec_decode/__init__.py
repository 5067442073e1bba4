"""Speculative decoding: cheap proposers draft tokens, the target model checks them all
in one batched step (docs/speculative-decoding.md).

One module per concept: :mod:`.proposer` (the protocol and each sequence's token
history), :mod:`.ngram` and :mod:`.suffix` (the token-lookup methods),
:mod:`.draft_model` (a small model drafting on its own runner and blocks) and
:mod:`.draft_setup` (reading and loading it at engine set-up), :mod:`.verify` (which
drafted tokens the target accepts, exactly as sampling would), :mod:`.adaptive` (how
many to draft, from measured acceptance and the measured cost of a verification step),
:mod:`.stats` (the counters ``/metrics`` shows) and :mod:`.speculator` (what the
scheduler and the engine call).
"""
