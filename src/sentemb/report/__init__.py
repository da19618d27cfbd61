"""What leaves the pipeline: result tables (:mod:`.tables`), the paper-vs-reproduced table and figures
(:mod:`.paper`, :mod:`.figures`) in one style (:mod:`.style`), studies' tables and figures
(:mod:`.studies`), the papers' printed rows (:mod:`.paper_tables`) and model cards (:mod:`.model_card`)."""
