"""`gpuwatch browse`: the database in Datasette (an optional extra, `gpuwatch[browse]`).

`metadata` says what Datasette shows (descriptions with units, canned queries, their charts)
and imports no Datasette; `server` is the only module that imports Datasette, and only the
`browse` command imports it.
"""
