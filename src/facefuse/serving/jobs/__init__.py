"""Long work as jobs: the queue's client (:mod:`.queue`), the job records and their files
(:mod:`.store`), and ``facefuse worker`` (:mod:`.worker`), which runs them."""
