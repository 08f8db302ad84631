"""The leaves: what drafting, generation, the heads and the trainer all use, importing none of them.

================== ==============================================================================================
``files``          ``write_text_atomic``: a file written whole or not at all (the scripts' results, the trainer's
                   resumable records)
``pairs``          what a (target, draft) pair must share: vocabulary, widths, recorded ids
``realign``        ``Realignment``: how a round moves the batch's rows, applied to sequences, masks, features,
                   caches and logits processors alike (and ``roll_rows_right``, its one row roll)
``round_profile``  wall time per phase of the loop while ``profile_rounds()`` is open (``bench --profile``)
================== ==============================================================================================

Nothing here imports another room of the package (``compat`` aside); ``tests/test_architecture.py`` checks it.
"""
