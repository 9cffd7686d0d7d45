"""The stages, one per module, named after what they prove (``prepare``, ``device``,
``pilot``, ...). What a stage is, how it fails and the table that orders them live in
``runner/stage.py``; the loop over that table in ``runner/ladder.py``."""
