"""Provider: the only way out to a provider. One HTTP/1.1 client with a connection
pool (``client``, ``wire``), the credential put on each request (``credentials``: header,
query, AWS SigV4, OAuth2), one counted, timed and traced call (``send``), and answer headers
scrubbed and URLs rewritten to the gateway (``headers``).

Never follows a URL to another origin, never logs a secret. May import ``gateway.observe``
and the layers below it.
"""
