"""Online backup and verified restore of a node's or cluster's durable state (issue 39).

`manifest` (pure) says what an archive holds, `archive` writes and reads the tar with a
checksum per member, `collect` fixes what an export reads at one cut, `export` streams it,
`restore` checks an archive (or a full one and its increments, `chain`) and brings it
back. The interface is /work/helpers/BACKUP_CONTRACT.md; the layout and the cut are
docs/backup.md.
"""
