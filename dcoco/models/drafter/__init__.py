"""The block drafter: its config and checkpoints, copy hints, the decoding pass, the draft
vocabulary, the catalogue."""
