"""MLflow tracking: one run per job (:mod:`.runs`), a durable queue for what the server missed
(:mod:`.queue`), the store's locking (:mod:`.store`) and a local server (:mod:`.server`)."""
