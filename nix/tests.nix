# Checks of nix/env.nix, run by tests/nix.rs:
#   nix-instantiate --eval --strict --json nix/tests.nix
# evaluates to the list of failures (empty when everything holds).
let
  env = import ./env.nix;
  d = env.defaults;
  with' = over: d // over;

  check = name: got: want:
    if got == want then [ ] else [ "${name}: got ${builtins.toJSON got}, want ${builtins.toJSON want}" ];

  fails = cfg: env.failedAssertions cfg;
  rejected = name: cfg: needle:
    let f = fails cfg; in
    if builtins.any (m: builtins.match ".*${needle}.*" m != null) f then [ ]
    else [ "${name}: expected a failed assertion matching '${needle}', got ${builtins.toJSON f}" ];
  accepted = name: cfg:
    let f = fails cfg; in
    if f == [ ] then [ ] else [ "${name}: unexpected failed assertions ${builtins.toJSON f}" ];

  extra = files: with' { frontend = { dist = null; extraFiles = files; }; };
in
# The default options.
check "default env" (env.agentEnv d) {
  HIVE_LABEL = "hive";
  HIVE_SOCKET = "/run/hive/mcp.sock";
  HIVE_BASH_SOCKET = "/run/hive-bash/socket";
  HIVE_AUTO_COMPACT = "true";
  HIVE_TOOL_GROUPS = "messaging,meta,inbox,execution";
  HIVE_PORT = "7700";
  HIVE_BIND = "127.0.0.1";
  HIVE_CLAUDE_MARKETPLACES = "anthropics/claude-plugins-official";
  HIVE_CLAUDE_PLUGINS = "";
  HIVE_CLAUDE_PLUGINS_AUTO_UPDATE = "false";
  HIVE_FORGE_URL = "http://localhost:3000";
  HIVE_MATRIX_URL = "http://localhost:8008";
  HIVE_BASH_ENV = "/etc/hyperhive/bash-env.sh";
}
++ accepted "defaults" d
# Every option that maps to a variable.
++ check "all options" (env.agentEnv (with' {
  label = "ana";
  model = "sonnet";
  autoCompact = false;
  icon = "/nix/store/x-icon.svg";
  staticDir = "/nix/store/x-static";
  frontend = { dist = "/nix/store/x-dist"; extraFiles = { }; };
  forge.url = "https://forge.example";
  matrix.url = "";
  claudeMarketplaces = [ "anthropics/claude-plugins-official" "me/market" ];
  claudePlugins = [ "formatter@me" "lint@me" ];
  claudePluginsAutoUpdate = true;
  cargo.shortMessages = false;
  toolGroups = [ "messaging" "web_tools" ];
  socket = "/run/hive/ana.sock";
  web = { port = 7801; bind = "0.0.0.0"; };
  extraEnv = { HIVE_TURN_TIMEOUT_SECS = "1800"; };
})) {
  HIVE_LABEL = "ana";
  HIVE_SOCKET = "/run/hive/ana.sock";
  HIVE_BASH_SOCKET = "/run/hive-bash/socket";
  HIVE_DEFAULT_MODEL = "sonnet";
  HIVE_AUTO_COMPACT = "false";
  HIVE_ICON = "/nix/store/x-icon.svg";
  HIVE_STATIC_DIR = "/nix/store/x-static";
  HIVE_WEB_DIST = "/nix/store/x-dist";
  HIVE_FORGE_URL = "https://forge.example";
  HIVE_TOOL_GROUPS = "messaging,web_tools";
  HIVE_PORT = "7801";
  HIVE_BIND = "0.0.0.0";
  HIVE_CLAUDE_MARKETPLACES = "anthropics/claude-plugins-official,me/market";
  HIVE_CLAUDE_PLUGINS = "formatter@me,lint@me";
  HIVE_CLAUDE_PLUGINS_AUTO_UPDATE = "true";
  HIVE_TURN_TIMEOUT_SECS = "1800";
}
# URLs.
++ check "url ok" (map env.validUrl [ "" "http://localhost:3000" "https://f.example/x" ]) [ true true true ]
++ check "url bad" (map env.validUrl [ "localhost:3000" "ftp://x" "http://" "http://a b" "https//x" ]) [ false false false false false ]
++ rejected "bad forge url" (with' { forge.url = "forge.local"; }) "forge.url must be an http"
++ rejected "bad matrix url" (with' { matrix.url = "matrix://x"; }) "matrix.url must be an http"
++ accepted "empty urls" (with' { forge.url = ""; matrix.url = ""; })
++ rejected "bad label" (with' { label = "Ana"; }) "label must be"
# frontend.extraFiles targets.
++ accepted "good targets" (extra {
  "games/bitburner" = { source = "/x"; };
  my-page = { source = "/y"; target = "my-page.html"; };
  "_private/a.b-c" = { source = "/z"; };
  "9lives" = { source = "/z"; };
})
++ rejected "leading dot" (extra { ".hidden" = { source = "/x"; }; }) "must start with"
++ rejected "leading slash" (extra { x = { source = "/x"; target = "/abs"; }; }) "must start with"
++ rejected "leading dash" (extra { "-x" = { source = "/x"; }; }) "must start with"
++ rejected "space" (extra { "a b" = { source = "/x"; }; }) "may only contain"
++ rejected "tilde" (extra { "a~" = { source = "/x"; }; }) "may only contain"
++ rejected "dotdot" (extra { "a/../b" = { source = "/x"; }; }) "may not contain a \\.\\. segment"
++ rejected "dotdot at end" (extra { x = { source = "/x"; target = "a/.."; }; }) "\\.\\. segment"
++ rejected "index collision" (extra { "index.html" = { source = "/x"; }; }) "collides with index.html"
++ rejected "static collision" (extra { "static/app.js" = { source = "/x"; }; }) "collides with static"
++ rejected "api collision" (extra { x = { source = "/x"; target = "api/v2"; }; }) "collides with api"
++ rejected "dist collision" ((extra { "assets/a.png" = { source = "/x"; }; }) // { distEntries = [ "assets" ]; }) "collides with assets"
++ check "target default and override" [ (env.targetOf "a/b" { }) (env.targetOf "a/b" { target = null; }) (env.targetOf "a" { target = "b.html"; }) ] [ "a/b" "a/b" "b.html" ]
# Dashboard links.
++ check "links json" (builtins.fromJSON (env.dashboardLinksJson [
  { label = "Stats"; icon = "📊"; url = "http://localhost:9001/stats"; }
  { label = "Scratchpad"; url = "http://localhost:8080"; }
])) [
  { label = "Stats"; icon = "📊"; url = "http://localhost:9001/stats"; }
  { label = "Scratchpad"; icon = ""; url = "http://localhost:8080"; }
]
++ rejected "link without url" (with' { dashboardLinks = [ { label = "x"; } ]; }) "needs a label"
++ rejected "link with bad url" (with' { dashboardLinks = [ { label = "x"; url = "x.com"; } ]; }) "needs a label"
# The hive config for the broker.
++ check "hive config" (builtins.fromJSON (env.hiveConfig {
  hiveName = "pr1ma";
  agents = {
    ruth = { model = "sonnet"; capabilities = [ "query_agent_state" ]; };
    scout = { parent = "ruth"; allowedRecipients = [ "operator" ]; toolGroups = [ "messaging" "web_tools" ]; socketUid = 1001; };
  };
})) {
  hive_name = "pr1ma";
  agents = [
    { name = "ruth"; model = "sonnet"; capabilities = [ "query_agent_state" ]; }
    { name = "scout"; parent = "ruth"; allowed_recipients = [ "operator" ]; tool_groups = [ "messaging" "web_tools" ]; socket_uid = 1001; }
  ];
}
# The swarm: the host module's matrix options become the config's matrix section.
++ (let
  m = env.matrixDefaults // {
    enable = true;
    homeserver = "https://matrix.example.org";
    userId = "@hive-one-bridge:example.org";
    passwordFile = "/run/keys/matrix-password";
    room = "#swarm:example.org";
    peers.two = "@hive-two-bridge:example.org";
  };
  failed = over: map (a: a.message) (builtins.filter (a: !a.assertion)
    (env.matrixAssertions ({ hiveName = "one"; matrix = m; } // over)));
  rejectedM = name: over: needle:
    if builtins.any (x: builtins.match ".*${needle}.*" x != null) (failed over) then [ ]
    else [ "${name}: expected a failed assertion matching '${needle}', got ${builtins.toJSON (failed over)}" ];
in
check "swarm config" (builtins.fromJSON (env.hiveConfig {
  hiveName = "one";
  matrix = m // { operators = [ "@alice:example.org" ]; operatorRoom = "!ops:example.org"; };
  agents.a = { allowedRecipients = [ "b@two" ]; };
})) {
  hive_name = "one";
  agents = [ { name = "a"; allowed_recipients = [ "b@two" ]; } ];
  matrix = {
    homeserver = "https://matrix.example.org";
    user_id = "@hive-one-bridge:example.org";
    password_file = "/run/keys/matrix-password";
    room = "#swarm:example.org";
    peers.two = "@hive-two-bridge:example.org";
    operators = [ "@alice:example.org" ];
    operator_room = "!ops:example.org";
  };
}
++ check "no swarm, no section" (builtins.fromJSON (env.hiveConfig {
  hiveName = "one"; matrix = m // { enable = false; }; agents = { };
})) { hive_name = "one"; agents = [ ]; }
++ check "swarm accepted" (failed { }) [ ]
++ rejectedM "swarm without a hive name" { hiveName = null; } "needs services.hyperhive.hiveName"
++ rejectedM "swarm with a bad hive name" { hiveName = "One"; } "needs services.hyperhive.hiveName"
++ rejectedM "both secrets" { matrix = m // { accessTokenFile = "/t"; }; } "exactly one of passwordFile and accessTokenFile"
++ rejectedM "bad homeserver" { matrix = m // { homeserver = "matrix.example.org"; }; } "homeserver must be an http"
++ rejectedM "bad peer" { matrix = m // { peers.Two = "@x:y"; }; } "every hive name")
# Item 6: the prompt identity, the operator's pronouns, per-model context
# windows (unset by default: the default env above has none) and extra MCP servers.
++ check "identity and windows" (env.agentEnv (with' {
  hiveName = "pr1ma";
  swarmName = "constellat1on";
  operatorPronouns = "they/them";
  contextWindowTokens = { sonnet = 1000000; "opus-4.1" = 1000000; Haiku = 200000; };
  extraMcpServers = { search = { command = "/bin/s"; args = [ "-x" ]; env = { A = "1"; }; allowedTools = [ "*" ]; }; };
  extraEnv = { HIVE_CONTEXT_WINDOW_TOKENS_HAIKU = "150000"; };
})) (env.agentEnv d // {
  HIVE_HIVE_NAME = "pr1ma";
  HIVE_SWARM_NAME = "constellat1on";
  HIVE_OPERATOR_PRONOUNS = "they/them";
  HIVE_CONTEXT_WINDOW_TOKENS_SONNET = "1000000";
  HIVE_CONTEXT_WINDOW_TOKENS_OPUS_4_1 = "1000000";
  # extraEnv wins over the option.
  HIVE_CONTEXT_WINDOW_TOKENS_HAIKU = "150000";
  HIVE_EXTRA_MCP_SERVERS = builtins.toJSON { search = { command = "/bin/s"; args = [ "-x" ]; env = { A = "1"; }; allowedTools = [ "*" ]; }; };
})
++ accepted "identity and windows ok" (with' { contextWindowTokens = { "claude-sonnet-4.5" = 1000000; }; extraMcpServers.s = { command = "/bin/s"; }; })
++ rejected "window key" (with' { contextWindowTokens = { "so net" = 1; }; }) "contextWindowTokens.*part of a model name"
++ rejected "window value" (with' { contextWindowTokens = { sonnet = 0; }; }) "positive number of tokens"
++ rejected "mcp server without command" (with' { extraMcpServers.s = { args = [ ]; }; }) "extraMcpServers.*needs a command"
++ rejected "mcp server name" (with' { extraMcpServers."a.b" = { command = "/bin/b"; }; }) "extraMcpServers.*a name of letters"
++ accepted "remote mcp server" (with' { extraMcpServers.remote = { url = "https://mcp.example/sse"; }; })
++ rejected "mcp server named like hive's own" (with' { extraMcpServers.bash = { command = "/bin/b"; }; }) "not hyperhive or bash"
