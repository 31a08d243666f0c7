"""dcoco: speculative decoding with corrected parallel drafts.

Tensor shapes in comments use one alphabet of words: `batch`, `tokens` (a run of positions fed to a
model), `slots` (draft positions of a block, block_size - 1), `K` (candidates per slot), `vocab`,
`hidden`, `taps` (tapped target layers).
"""

__version__ = "0.1.0"
