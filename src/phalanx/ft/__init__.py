"""Per-step fault tolerance on torchft (`--fault-tolerance torchft`).

Each rank is a replica group: `groups` starts a lighthouse and one `phalanx train` per
group (each under torch's elastic agent, so a dead group restarts on its own), and
`replica` joins the trainer's loop to torchft's Manager — a quorum every step, gradients
averaged over the live groups, a returning group healed from a live one. See
docs/fault-tolerance.md.
"""
