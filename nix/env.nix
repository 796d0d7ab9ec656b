# The pure half of the hyperhive NixOS modules: option values in, environment
# variables, JSON files and assertion messages out. Uses builtins only (no
# nixpkgs), so CI evaluates it with `nix-instantiate --eval --strict
# nix/tests.nix`. module.nix and host.nix call these functions; docs/deploy.md
# lists every option and the variable it sets.
let
  inherit (builtins)
    all any concatStringsSep elem filter head isString isInt isAttrs length map
    match split toJSON attrNames listToAttrs replaceStrings;

  lower = [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" "-" "." ];
  upper = [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" "_" "_" ];

  boolStr = b: if b then "true" else "false";
  commaList = concatStringsSep ",";
  segments = s: filter isString (split "/" s);
in
rec {
  # Defaults of the per-agent options (`hyperhive.*`), as module.nix declares them.
  defaults = {
    label = "hive";
    model = null;
    autoCompact = true;
    icon = null;
    dashboardLinks = [ ];
    staticDir = null; # the merged frontend.extraFiles tree, when there is one
    frontend = { dist = null; extraFiles = { }; };
    forge.url = "http://localhost:3000";
    matrix.url = "http://localhost:8008";
    claudeMarketplaces = [ "anthropics/claude-plugins-official" ];
    claudePlugins = [ ];
    claudePluginsAutoUpdate = false;
    cargo.shortMessages = true;
    toolGroups = [ "messaging" "meta" "inbox" "execution" ];
    allowedRecipients = [ ];
    socket = "/run/hive/mcp.sock";
    bashSocket = "/run/hive-bash/socket";
    web = { port = 7700; bind = "127.0.0.1"; };
    # The prompt identity and the operator's pronouns; on a host that also
    # imports host.nix, module.nix takes these from services.hyperhive.
    hiveName = null;
    swarmName = null;
    operatorPronouns = null; # null: the harness default (she/her)
    # Per-model context windows, keyed by a part of the model name; unset by
    # default (the window the CLI reports wins).
    contextWindowTokens = { };
    # More MCP servers for claude: { name = { command; args; env; allowedTools; }; }.
    extraMcpServers = { };
    extraEnv = { };
  };

  # HIVE_CONTEXT_WINDOW_TOKENS_<KEY> for a contextWindowTokens key.
  windowVar = key: "HIVE_CONTEXT_WINDOW_TOKENS_${replaceStrings lower upper key}";

  # A contextWindowTokens key: a part of a model name.
  validWindowKey = k: match "[A-Za-z0-9][A-Za-z0-9._-]*" k != null;

  # An extraMcpServers entry: a command to run (or the url of a remote
  # server), under a name of letters, digits, _ and - that is not one of
  # hive's own servers (what the harness checks at boot).
  validMcpServer = s: isAttrs s && (isString (s.command or null) && s.command != "" || isString (s.url or null));
  validMcpName = n: match "[A-Za-z0-9_-]+" n != null && n != "hyperhive" && n != "bash";

  # Paths the web UI answers itself or the default dist holds: an extra file
  # may not be placed on them.
  reservedTargets = [ "index.html" "static" "api" "events" "login" "icon" "metrics" ];

  # http:// or https:// followed by something without spaces, or "".
  validUrl = s: s == "" || match "https?://[^[:space:]]+" s != null;

  # frontend.extraFiles target names.
  targetProblem = reserved: t:
    if match "[A-Za-z0-9_].*" t == null then
      "must start with a letter, a digit or _"
    else if match "[A-Za-z0-9_./-]*" t == null then
      "may only contain letters, digits, _ . / -"
    else if elem ".." (segments t) then
      "may not contain a .. segment"
    else if elem (head (segments t)) reserved then
      "collides with ${head (segments t)} of the default dist"
    else
      null;
  validTarget = reserved: t: targetProblem reserved t == null;

  # The resolved target of one frontend.extraFiles entry.
  targetOf = name: entry: if (entry.target or null) != null then entry.target else name;

  # The hive label must be a broker agent name.
  validLabel = l: match "[a-z0-9-]{1,9}" l != null;

  # [ { assertion; message; } ] for one agent's options, NixOS style.
  assertions = cfg:
    let
      reserved = reservedTargets ++ (cfg.distEntries or [ ]);
      extra = cfg.frontend.extraFiles;
    in
    [
      {
        assertion = validUrl cfg.forge.url;
        message = "hyperhive.forge.url must be an http:// or https:// URL or \"\", got \"${cfg.forge.url}\"";
      }
      {
        assertion = validUrl cfg.matrix.url;
        message = "hyperhive.matrix.url must be an http:// or https:// URL or \"\", got \"${cfg.matrix.url}\"";
      }
      {
        assertion = validLabel cfg.label;
        message = "hyperhive.label must be 1-9 characters of a-z, 0-9 and -, got \"${cfg.label}\"";
      }
    ]
    ++ map
      (name:
        let t = targetOf name extra.${name}; in {
          assertion = validTarget reserved t;
          message = "hyperhive.frontend.extraFiles.\"${name}\": target \"${t}\" ${toString (targetProblem reserved t)}";
        })
      (attrNames extra)
    ++ map
      (l: {
        assertion = l ? label && l ? url && validUrl l.url && l.url != "";
        message = "hyperhive.dashboardLinks: every link needs a label and an http(s) url, got ${toJSON l}";
      })
      cfg.dashboardLinks
    ++ map
      (k: {
        assertion = validWindowKey k && isInt cfg.contextWindowTokens.${k} && cfg.contextWindowTokens.${k} > 0;
        message = "hyperhive.contextWindowTokens.\"${k}\": the key must be a part of a model name (letters, digits, . _ -) and the value a positive number of tokens, got ${toJSON cfg.contextWindowTokens.${k}}";
      })
      (attrNames (cfg.contextWindowTokens or { }))
    ++ map
      (n: {
        assertion = validMcpServer cfg.extraMcpServers.${n} && validMcpName n;
        message = "hyperhive.extraMcpServers.\"${n}\": needs a command (or url), and a name of letters, digits, _ and - that is not hyperhive or bash (hive's own servers), got ${toJSON cfg.extraMcpServers.${n}}";
      })
      (attrNames (cfg.extraMcpServers or { }));

  # The messages of the failed assertions (what NixOS would print).
  failedAssertions = cfg: map (a: a.message) (filter (a: !a.assertion) (assertions cfg));

  # The environment of `hive serve` for one agent (docs/env.md, docs/web.md).
  agentEnv = cfg:
    let
      opt = cond: attrs: if cond then attrs else { };
    in
    {
      HIVE_LABEL = cfg.label;
      HIVE_SOCKET = cfg.socket;
      HIVE_BASH_SOCKET = cfg.bashSocket;
      HIVE_AUTO_COMPACT = boolStr cfg.autoCompact;
      HIVE_TOOL_GROUPS = commaList cfg.toolGroups;
      HIVE_PORT = toString cfg.web.port;
      HIVE_BIND = cfg.web.bind;
      HIVE_CLAUDE_MARKETPLACES = commaList cfg.claudeMarketplaces;
      HIVE_CLAUDE_PLUGINS = commaList cfg.claudePlugins;
      HIVE_CLAUDE_PLUGINS_AUTO_UPDATE = boolStr cfg.claudePluginsAutoUpdate;
      # Set even when "": an empty URL switches forge notifications off (unset,
      # hive would use its default URL).
      HIVE_FORGE_URL = cfg.forge.url;
    }
    // opt (cfg.model != null) { HIVE_DEFAULT_MODEL = cfg.model; }
    // opt (cfg.icon != null) { HIVE_ICON = toString cfg.icon; }
    // opt (cfg.staticDir != null) { HIVE_STATIC_DIR = toString cfg.staticDir; }
    // opt (cfg.frontend.dist != null) { HIVE_WEB_DIST = toString cfg.frontend.dist; }
    // opt (cfg.matrix.url != "") { HIVE_MATRIX_URL = cfg.matrix.url; }
    // opt cfg.cargo.shortMessages { HIVE_BASH_ENV = "/etc/hyperhive/bash-env.sh"; }
    // opt ((cfg.hiveName or null) != null) { HIVE_HIVE_NAME = cfg.hiveName; }
    // opt ((cfg.swarmName or null) != null) { HIVE_SWARM_NAME = cfg.swarmName; }
    // opt ((cfg.operatorPronouns or null) != null) { HIVE_OPERATOR_PRONOUNS = cfg.operatorPronouns; }
    // listToAttrs (map
      (k: { name = windowVar k; value = toString cfg.contextWindowTokens.${k}; })
      (attrNames (cfg.contextWindowTokens or { })))
    // opt ((cfg.extraMcpServers or { }) != { }) { HIVE_EXTRA_MCP_SERVERS = toJSON cfg.extraMcpServers; }
    // cfg.extraEnv;

  # `<state>/hyperhive-dashboard-links.json`.
  dashboardLinksJson = links:
    toJSON (map (l: { inherit (l) label url; icon = l.icon or ""; }) links);

  # One agent's entry of the hive config (docs/config.md) for `hive broker`.
  brokerEntry = name: a:
    { inherit name; }
    // (if (a.parent or null) != null then { inherit (a) parent; } else { })
    // (if (a.model or null) != null then { inherit (a) model; } else { })
    // (if (a.allowedRecipients or [ ]) != [ ] then { allowed_recipients = a.allowedRecipients; } else { })
    // (if a ? toolGroups then { tool_groups = a.toolGroups; } else { })
    // (if (a.capabilities or [ ]) != [ ] then { inherit (a) capabilities; } else { })
    // (if (a.socketUid or null) != null then { socket_uid = a.socketUid; } else { })
    // (if (a.socketGid or null) != null then { socket_gid = a.socketGid; } else { });

  # One agent's entry of the fleet file `hive up` runs (docs/fleet.md) from
  # the host module's per-agent options: the broker's keys and every option
  # of an agent module, each under its fleet-file key. Options at their
  # default are left out (cargo.shortMessages and autoCompact default to
  # true, so only false is written). Path values are given as strings
  # (host.nix interpolates a nix path into the store first).
  fleetEntry = name: a:
    let
      opt = cond: attrs: if cond then attrs else { };
      set = k: (a.${k} or null) != null;
      nonEmpty = k: (a.${k} or [ ]) != [ ] && (a.${k} or { }) != { } && (a.${k} or null) != null;
      link = l: { inherit (l) label url; } // opt ((l.icon or "") != "") { inherit (l) icon; };
    in
    brokerEntry name a
    // opt (set "autoCompact" && !a.autoCompact) { auto_compact = false; }
    // opt (set "icon") { icon = a.icon; }
    // opt (nonEmpty "dashboardLinks") { dashboard_links = map link a.dashboardLinks; }
    // opt (set "staticDir") { static_dir = a.staticDir; }
    // opt (set "webDist") { web_dist = a.webDist; }
    // opt ((a.forge.url or null) != null) { forge_url = a.forge.url; }
    // opt ((a.matrix.url or null) != null) { matrix_url = a.matrix.url; }
    // opt (set "claudeMarketplaces") { claude_marketplaces = a.claudeMarketplaces; }
    // opt (nonEmpty "claudePlugins") { claude_plugins = a.claudePlugins; }
    // opt ((a.claudePluginsAutoUpdate or false) == true) { claude_plugins_auto_update = true; }
    // opt ((a.cargo.shortMessages or true) == false) { cargo_short_messages = false; }
    // opt (set "operatorPronouns") { operator_pronouns = a.operatorPronouns; }
    // opt (nonEmpty "contextWindowTokens") { context_window_tokens = a.contextWindowTokens; }
    // opt (nonEmpty "extraMcpServers") { extra_mcp_servers = a.extraMcpServers; }
    // opt (nonEmpty "extraEnv") { env = a.extraEnv; }
    // opt (set "account") { inherit (a) account; }
    // opt (set "budget") { inherit (a) budget; }
    // opt (set "turnUsd") { turn_usd = a.turnUsd; };

  # The fleet file for `hive up` (services.hyperhive.up): the hive config
  # with every agent's fleetEntry, the hive's budget and its `web` section.
  fleetFile = { hiveName ? null, swarmName ? null, operatorGid ? null, matrix ? null, budget ? null, web ? null, retention ? null, maxClaude ? null, notify ? null, telemetry ? null, agents }:
    toJSON (
      { agents = map (n: fleetEntry n agents.${n}) (attrNames agents); }
      // (if hiveName != null then { hive_name = hiveName; } else { })
      // (if swarmName != null then { swarm_name = swarmName; } else { })
      // (if operatorGid != null then { operator_gid = operatorGid; } else { })
      // (if matrix != null && matrix.enable then { matrix = matrixSection matrix; } else { })
      // (if budget != null then { inherit budget; } else { })
      // (if web != null && web != { } then { inherit web; } else { })
      // (if retention != null then { inherit retention; } else { })
      // (if maxClaude != null then { max_claude = maxClaude; } else { })
      // (if notify != null then { inherit notify; } else { })
      // (if telemetry != null then { inherit telemetry; } else { })
    );

  # The activation step of `hive up` on NixOS: installs the declared fleet
  # file at the stable, writable path the hive runs with, merged with the
  # operator's writes by `hive fleet merge` (the fleet file's three-way
  # rule, against the declaration installed last). A key changed on both
  # sides fails the step (`false`, which NixOS reports as a failed
  # activation), naming the key, and leaves both files as they were.
  fleetActivation = { hive, declared, dataDir, user, group }: ''
    install -d -m 0750 -o ${user} -g ${group} ${dataDir}
    if ! ${hive}/bin/hive fleet merge ${declared} --into ${dataDir}/hive.json --base ${dataDir}/hive.declared.json; then
      echo "hyperhive: the declared fleet file was not installed into ${dataDir}/hive.json (see above); the hive keeps running with the file as it is" >&2
      false
    fi
    chown ${user}:${group} ${dataDir}/hive.json ${dataDir}/hive.declared.json
  '';

  # The hive config JSON for the host module.
  hiveConfig = { hiveName ? null, swarmName ? null, operatorGid ? null, matrix ? null, agents }:
    toJSON (
      { agents = map (n: brokerEntry n agents.${n}) (attrNames agents); }
      // (if hiveName != null then { hive_name = hiveName; } else { })
      // (if swarmName != null then { swarm_name = swarmName; } else { })
      // (if operatorGid != null then { operator_gid = operatorGid; } else { })
      // (if matrix != null && matrix.enable then { matrix = matrixSection matrix; } else { })
    );

  # Defaults of the host module's `services.hyperhive.up.*` options.
  upDefaults = {
    enable = false;
    user = "hyperhive";
    group = "hyperhive";
    isolation = "required";
    listen = "127.0.0.1:7890";
    publicOrigin = null;
    scriptPages = { };
    budget = null;
    retention = null;
    maxClaude = null;
    notify = null;
    telemetry = null;
    extraPackages = [ ];
    environment = { };
  };

  # Defaults of the host module's `services.hyperhive.matrix.*` options.
  matrixDefaults = {
    enable = false;
    passwordFile = null;
    accessTokenFile = null;
    peers = { };
    deviceId = null;
    operators = [ ];
    operatorRoom = null;
    stateDir = "/var/lib/hyperhive-matrix";
  };

  # The hive config's `matrix` section (docs/swarm.md) from those options.
  matrixSection = m:
    { homeserver = m.homeserver; user_id = m.userId; room = m.room; }
    // (if m.passwordFile != null then { password_file = m.passwordFile; } else { })
    // (if m.accessTokenFile != null then { access_token_file = m.accessTokenFile; } else { })
    // (if m.peers != { } then { inherit (m) peers; } else { })
    // (if m.deviceId != null then { device_id = m.deviceId; } else { })
    // (if m.operators != [ ] then { inherit (m) operators; } else { })
    // (if m.operatorRoom != null then { operator_room = m.operatorRoom; } else { });

  # What the host module asserts about the swarm (the broker checks the rest
  # of the section when it loads the config).
  matrixAssertions = { hiveName, matrix }:
    if !matrix.enable then [ ] else [
      {
        assertion = hiveName != null && validLabel hiveName;
        message = "services.hyperhive.matrix needs services.hyperhive.hiveName, 1-9 characters of a-z, 0-9 and - (other hives write to NAME@HIVENAME)";
      }
      {
        assertion = (matrix.passwordFile == null) != (matrix.accessTokenFile == null);
        message = "services.hyperhive.matrix: set exactly one of passwordFile and accessTokenFile";
      }
      {
        assertion = matrix.homeserver != "" && validUrl matrix.homeserver;
        message = "services.hyperhive.matrix.homeserver must be an http:// or https:// URL, got \"${matrix.homeserver}\"";
      }
      {
        assertion = all validLabel (attrNames matrix.peers);
        message = "services.hyperhive.matrix.peers: every hive name must be 1-9 characters of a-z, 0-9 and -, got ${toJSON (attrNames matrix.peers)}";
      }
    ];
}
