"""The OAuth broker for connectors (issue 12): sign-in to remote MCP servers and, later, to providers.

- ``storage``: the SDK's ``TokenStorage`` over the encrypted credential store, restart-safe;
- ``sdk_context``: the one reach into the SDK provider's internals (python-sdk#3250);
- ``flow``: a provider for a server URL, the authorization drivers, the S256 and URL rules;
- ``conformance_client``: the entry point the official conformance suite runs.

Layer: above ``store``; it knows nothing of the bus, the connectors or the web edge.
"""
