"""Speculative decoding, the runner's wing: drafters propose, one verify forward checks, the
accepted drafts are kept and the recurrent state rolled back past the rest.

`drafter.py` (the `Drafter` interface), `ngram_drafter.py`, `mtp_drafter.py` and
`block_drafter.py` (the drafters: prompt lookup, the MTP head, the `--draft-model` block drafter),
`verify.py` (the verify forward's layout, acceptance, roll-back points), `step.py` (the phases of
a step that drafts), `target.py` (the runner's face the step drives), `policy.py` (the
scheduler's side: who drafts, how many, whether it pays), `rejection_sampler.py` (the reference
of acceptance).
"""
