"""The mirror: copy what the trainer writes on local disk to the share, in a worker process that can be killed.

plan (walk the local source, compare with the record of what is on the share) -> copier (a child
process that writes each file to a temporary name on the share and renames it) -> runner (supervises
the child, kills it when a file makes no progress, keeps the record and the state) -> worker (the
daemon's threads, one per mirror, on each mirror's schedule).
"""
