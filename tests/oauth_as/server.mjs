// A real authorization server for sidecar's OAuth tests: panva's oidc-provider (pinned in package.json),
// auto-approving every login and consent, on 127.0.0.1:<port> (argv[2]) for the resource argv[3].
// Config as in /work/shared/notes/oauth.md §6: DCR, PKCE, RFC 9207 iss, RFC 8707 resource indicators,
// rotating refresh tokens (reuse revokes the grant), RFC 7009 revocation, RFC 7662 introspection.
// Env: AT_TTL (access token seconds, default 3600); NO_S256=1 strips code_challenge_methods_supported
// from the metadata (an AS sidecar must refuse); CIMD=1 advertises client_id_metadata_document_supported (the
// metadata only: a client id URL is not resolved, so the authorization request itself is not answered); STATIC_CLIENT_ID, STATIC_CLIENT_SECRET and STATIC_REDIRECT_URI
// add a pre-registered confidential client; NO_REGISTRATION=1 turns dynamic registration off;
// TOKEN_ONLY_REVOCATION=1 makes a revocation end only the token named, not its whole grant (RFC 7009 §2.1
// lets an AS do either: a client must revoke every token it holds); LOG_TOKENS=1 adds the tokens issued to
// each grant event (a test AS: it lets a test introspect every token a client ever obtained);
// TOKEN_DELAY_MS=n logs each token request as it arrives and holds its answer n ms (a race test's window:
// the tokens are issued, the client has not got them yet). Prints one
// JSON line per token-endpoint event and per dynamic registration to stdout.
import http from 'node:http';
import Provider from 'oidc-provider';

const [port, resource] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const clients = [{ client_id: 'rs', client_secret: 'rs-secret', grant_types: [], response_types: [], redirect_uris: [] }];
if (process.env.STATIC_CLIENT_ID) {
  clients.push({
    client_id: process.env.STATIC_CLIENT_ID,
    client_secret: process.env.STATIC_CLIENT_SECRET,
    redirect_uris: [process.env.STATIC_REDIRECT_URI],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  });
}
const provider = new Provider(issuer, {
  clients,
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: process.env.NO_REGISTRATION !== '1' },
    revocation: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({ scope: 'mcp admin', audience: resource, accessTokenFormat: 'opaque' }),
    },
  },
  scopes: ['openid', 'offline_access', 'mcp', 'admin'],
  rotateRefreshToken: true,
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  ttl: { AccessToken: Number(process.env.AT_TTL || 3600) },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});
provider.on('grant.success', (ctx) => {
  const tokens = process.env.LOG_TOKENS === '1' ? [ctx.body?.access_token, ctx.body?.refresh_token].filter(Boolean) : undefined;
  console.log(JSON.stringify({ event: 'grant', type: ctx.oidc.params.grant_type, tokens }));
});
provider.on('registration_create.success', (ctx, client) => console.log(JSON.stringify({ event: 'registration', client: client.clientId })));
provider.on('grant.error', (ctx, err) => console.log(JSON.stringify({ event: 'grant.error', error: err.error })));
provider.on('server_error', (ctx, err) => console.error(err));
const callback = provider.callback();

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session } = details;
  if (prompt.name === 'login') {
    return provider.interactionFinished(req, res, { login: { accountId: 'alice' } }, { mergeWithLastSubmission: false });
  }
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes || {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  const grantId = await grant.save();
  return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

// TOKEN_ONLY_REVOCATION=1: RFC 7009 revocation of the one token named (oidc-provider's own endpoint ends
// every token of the grant). No client authentication: this is a test AS.
async function revokeOneToken(req, res) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const value = new URLSearchParams(Buffer.concat(chunks).toString()).get('token');
  for (const model of [provider.AccessToken, provider.RefreshToken]) {
    const token = value ? await model.find(value, { ignoreExpiration: true }) : undefined;
    if (token) await token.destroy();
  }
  console.log(JSON.stringify({ event: 'revocation' }));
  res.statusCode = 200;
  res.end();
}

function editMetadata(res, edit) {
  const end = res.end.bind(res);
  res.end = (chunk, ...rest) => {
    const body = JSON.parse(chunk.toString());
    edit(body);
    const text = JSON.stringify(body);
    res.setHeader('content-length', Buffer.byteLength(text));
    return end(text, ...rest);
  };
}

http
  .createServer((req, res) => {
    if (req.url.startsWith('/interaction/')) {
      interaction(req, res).catch((err) => { console.error(err); res.statusCode = 500; res.end(); });
      return;
    }
    if (process.env.TOKEN_DELAY_MS && req.method === 'POST' && req.url === '/token') {
      console.log(JSON.stringify({ event: 'token_request' }));
      const end = res.end.bind(res);
      res.end = (...args) => { setTimeout(() => end(...args), Number(process.env.TOKEN_DELAY_MS)); return res; };
    }
    if (process.env.TOKEN_ONLY_REVOCATION === '1' && req.method === 'POST' && req.url === '/token/revocation') {
      revokeOneToken(req, res).catch((err) => { console.error(err); res.statusCode = 500; res.end(); });
      return;
    }
    if (req.url.startsWith('/.well-known/')) {
      if (process.env.NO_S256 === '1') editMetadata(res, (body) => delete body.code_challenge_methods_supported);
      if (process.env.CIMD === '1') editMetadata(res, (body) => { body.client_id_metadata_document_supported = true; });
    }
    callback(req, res);
  })
  .listen(Number(port), '127.0.0.1', () => console.log(JSON.stringify({ event: 'listening', issuer })));
