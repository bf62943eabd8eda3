"""The operations console: a web UI over the platform's JSON APIs (product shell layer).

Pages for the overview (nodes, gateways, functions, health), the jobs (rounds as they run),
FLStore's questions (answers as charts) and the checkpoints (presigned download links), behind
a login with the admin or analyst token (:mod:`console.sessions`). ``fedfaas up --with
console`` (or ``--with all``) starts it; ``fedfaas status`` prints its address.
"""
