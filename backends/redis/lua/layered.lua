-- Tollgate: decide every layer of one request in one call, all-or-nothing.
--
-- The store runs one script: common.lua, codes.lua, the five algorithm
-- files, refund.lua and this dispatcher, concatenated in that order
-- (src/script.rs). Each algorithm
-- lives in exactly one file; a single-policy decision is this same script
-- with one layer, so there is one source of truth per algorithm.
--
-- KEYS[i]  the state of layer i (distinct keys).
-- ARGV[1]  the caller's time in µs since the Unix epoch, or "" to read the
--          server's TIME (the default: one clock for every key).
-- ARGV[2]  with a caller's time: the largest allowed distance in µs from the
--          server's TIME, or "" for no check.
-- ARGV[3 + 5(i−1) ..] layer i: algorithm (codes.lua), cost, p1, p2, p3
--            TOKEN_BUCKET    p = capacity, refill, period_us
--            GCRA            p = burst, interval_us, 0
--            FIXED_WINDOW    p = limit, window_us, 0
--            SLIDING_WINDOW  p = limit, window_us, 0
--            SLIDING_LOG     p = limit, window_us, 0
--
-- Reply: 5 integers per layer, in KEYS order: allowed (1/0), limit,
--   remaining, reset_after µs, retry_after µs (−1 when the layer admits).
--
-- Modes, for the Redis Cluster store (src/cluster.rs), which decides the
-- keys of each hash slot in one call: a last ARGV after the layers selects
-- one. Without it the script decides as above (the standalone store).
--   'reserve'  decide as above; the reply has 7 integers per layer: the 5,
--              then what the charge needs to be refunded: the effective
--              time it charged at (µs) and a mark (token bucket: the scaled
--              level left; GCRA: the TAT written; otherwise 0); 0 0 when
--              nothing was charged.
--   'peek'     judge every layer, write nothing; the reply is the one a
--              denial gives (admitting layers report remaining + cost).
--   'refund'   give back reservations (refund.lua). KEYS: the layers'
--              keys; ARGV after the time: per layer algorithm, cost, p1, p2,
--              p3, at, mark; then 'refund'. Reply: per layer what was given
--              back. Not idempotent: the store sends a refund at most once.
-- Errors: "TOLLGATE_CONFLICT <i> <wrong_type|not_a_state>" when the i-th
--   key holds data Tollgate did not write (nothing is written, that key is
--   left as it was; a refund gives nothing back from such a key);
--   "TOLLGATE_SKEW <caller µs> <server µs> <max skew µs>" when the
--   caller's time is too far from the server's; "TOLLGATE_ARGS <why>" for
--   arguments this script does not understand.
--
-- Every layer is judged against its current state first. Only if every layer
-- admits is every layer written, each with its TTL (SET PX / PEXPIRE, so no
-- key ever lacks one). The TTL set is the algorithm's (milliseconds, rounded
-- up, at least 1) plus one millisecond: Redis counts a relative TTL from its
-- clock truncated to the millisecond, so "PX n" lives between n − 1 and n ms
-- (and "PX 1" can expire at once); the extra millisecond keeps every state
-- until the algorithm says it is as good as new, never shorter. Otherwise nothing is written, and the layers that
-- admitted report remaining + cost (capped at the limit): the request was not
-- charged (Rust: Verdict::uncharged).

local LOG = SLIDING_LOG
local ALGORITHMS = {
  [TOKEN_BUCKET] = token_bucket,
  [GCRA] = gcra,
  [FIXED_WINDOW] = fixed_window,
  [SLIDING_WINDOW] = sliding_window,
  [SLIDING_LOG] = sliding_log,
}
-- Refunds of counter states, by algorithm code (the log's is refund_sliding_log).
local REFUNDS = {
  [TOKEN_BUCKET] = refund_token_bucket,
  [GCRA] = refund_gcra,
  [FIXED_WINDOW] = refund_fixed_window,
  [SLIDING_WINDOW] = refund_sliding_window,
}

-- Lists up to this length are read whole; longer ones by binary search
-- with LINDEX, so a large log costs O(log n) reads.
local READ_WHOLE = 64
-- RPUSH at most this many entries per call (Lua's unpack has a stack limit).
local PUSH_CHUNK = 1000
-- Added to every TTL: Redis's millisecond truncation (see above).
local TTL_MARGIN_MS = 1

local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A counter state, or nil when the key is missing. A key holding anything
-- else (another type, or a string that is not three integers) was not
-- written by Tollgate: nil and what was found ('wrong_type', 'not_a_state'),
-- and the caller answers TOLLGATE_CONFLICT without touching the key.
local function read_cells(key)
  local v = redis.pcall('GET', key)
  if not v then
    return nil
  end
  if type(v) ~= 'string' then
    return nil, 'wrong_type'
  end
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  if not a then
    return nil, 'not_a_state'
  end
  return { tonumber(a), tonumber(b), tonumber(c) }
end

-- A sliding log as { n, at(i) } (n = 0 when the key is missing), or nil
-- and what was found when the key holds something Tollgate did not write
-- (another type, or a list whose ends are not timestamps).
local function read_log(key)
  local n = redis.pcall('LLEN', key)
  if type(n) ~= 'number' then
    return nil, 'wrong_type'
  end
  local log
  if n <= READ_WHOLE then
    local items = {}
    if n > 0 then
      items = redis.call('LRANGE', key, 0, -1)
    end
    log = { n = n, at = function(i) return tonumber(items[i]) end }
  else
    local seen = {}
    log = {
      n = n,
      at = function(i)
        local v = seen[i]
        if not v then
          v = tonumber(redis.call('LINDEX', key, i - 1))
          seen[i] = v
        end
        return v
      end,
    }
  end
  if n > 0 and not (log.at(1) and log.at(n)) then
    return nil, 'not_a_state'
  end
  return log
end

local function write_log(key, next, cost, ttl)
  if next.drop > 0 then
    redis.call('LTRIM', key, next.drop, -1)
  end
  local stamp = int(next.t)
  local left = cost
  while left > 0 do
    local chunk = math.min(left, PUSH_CHUNK)
    local args = {}
    for j = 1, chunk do
      args[j] = stamp
    end
    redis.call('RPUSH', key, unpack(args))
    left = left - chunk
  end
  redis.call('PEXPIRE', key, ttl + TTL_MARGIN_MS)
end

local mode = 'decide'
local layers = #KEYS
if #ARGV == 2 + 5 * layers then
  mode = 'decide'
elseif #ARGV == 3 + 5 * layers and (ARGV[#ARGV] == 'reserve' or ARGV[#ARGV] == 'peek') then
  mode = ARGV[#ARGV]
elseif #ARGV == 3 + 7 * layers and ARGV[#ARGV] == 'refund' then
  mode = 'refund'
else
  return redis.error_reply('TOLLGATE_ARGS expected 2 arguments and 5 per key')
end

local now
if ARGV[1] == '' then
  now = server_time()
else
  now = tonumber(ARGV[1])
  if not now then
    return redis.error_reply('TOLLGATE_ARGS the time must be an integer number of microseconds')
  end
  if ARGV[2] ~= '' then
    local server = server_time()
    local max_skew = tonumber(ARGV[2])
    if math.abs(now - server) > max_skew then
      return redis.error_reply('TOLLGATE_SKEW ' .. int(now) .. ' ' .. int(server) .. ' ' .. ARGV[2])
    end
  end
end

if mode == 'refund' then
  local reply = {}
  for i = 1, layers do
    local key = KEYS[i]
    local base = 2 + 7 * (i - 1)
    local code = tonumber(ARGV[base + 1])
    local cost = tonumber(ARGV[base + 2])
    local p1, p2, p3 = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
    local at, mark = tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7])
    if code == LOG then
      -- A list Tollgate did not write is left alone.
      local _, foreign = read_log(key)
      if foreign then
        reply[i] = 0
      else
        reply[i] = refund_sliding_log(key, cost, at)
      end
    else
      local run = REFUNDS[code]
      if not run then
        return redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(ARGV[base + 1]))
      end
      local given, cells = run(p1, p2, p3, read_cells(key), now, cost, at, mark)
      -- The state keeps its expiry: a refund only brings it closer to new.
      -- A key without one is left alone (nothing is stored without a TTL).
      local ttl = redis.call('PTTL', key)
      if cells and ttl > 0 then
        redis.call('SET', key, int(cells[1]) .. ' ' .. int(cells[2]) .. ' ' .. int(cells[3]), 'PX', ttl)
        reply[i] = given
      else
        reply[i] = 0
      end
    end
  end
  return reply
end

local reply = {}
local writes = {}
local all_allowed = true
for i = 1, #KEYS do
  local key = KEYS[i]
  local base = 2 + 5 * (i - 1)
  local code = tonumber(ARGV[base + 1])
  local run = ALGORITHMS[code]
  if not run then
    return redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(ARGV[base + 1]))
  end
  local cost = tonumber(ARGV[base + 2])
  local p1, p2, p3 = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
  local state, foreign
  if code == LOG then
    state, foreign = read_log(key)
  else
    state, foreign = read_cells(key)
  end
  if foreign then
    -- Nothing has been written yet: the whole call changes nothing.
    return redis.error_reply('TOLLGATE_CONFLICT ' .. i .. ' ' .. foreign)
  end
  local allowed, limit, remaining, reset_after, retry_after, next, ttl =
    run(p1, p2, p3, state, now, cost)
  if allowed then
    writes[i] = { key = key, log = code == LOG, next = next, ttl = ttl,
                  cost = cost, code = code }
  else
    all_allowed = false
  end
  local r = 5 * (i - 1)
  reply[r + 1] = allowed and 1 or 0
  reply[r + 2] = limit
  reply[r + 3] = remaining
  reply[r + 4] = reset_after
  reply[r + 5] = retry_after
end

-- Peeking writes nothing: report as a denial does.
if mode == 'peek' then
  all_allowed = false
end

if all_allowed then
  for i = 1, #KEYS do
    local w = writes[i]
    if w.log then
      write_log(w.key, w.next, w.cost, w.ttl)
    else
      local c = w.next
      redis.call('SET', w.key, int(c[1]) .. ' ' .. int(c[2]) .. ' ' .. int(c[3]), 'PX', w.ttl + TTL_MARGIN_MS)
    end
  end
else
  -- Nothing was charged: admitting layers give the cost back.
  for i = 1, #KEYS do
    local r = 5 * (i - 1)
    if reply[r + 1] == 1 then
      local cost = tonumber(ARGV[2 + 5 * (i - 1) + 2])
      reply[r + 3] = math.min(reply[r + 3] + cost, reply[r + 2])
    end
  end
end

if mode == 'reserve' then
  -- Append each layer's charge (at, mark), as refund_* expect them.
  local out = {}
  for i = 1, #KEYS do
    local r = 5 * (i - 1)
    for j = 1, 5 do
      out[7 * (i - 1) + j] = reply[r + j]
    end
    local at, mark = 0, 0
    local w = writes[i]
    if all_allowed and w then
      local c = w.next
      if w.log then
        at = c.t
      elseif w.code == SLIDING_WINDOW then
        at = c[3]
      else
        at = c[2]
        if w.code == TOKEN_BUCKET or w.code == GCRA then
          mark = c[1]
        end
      end
    end
    out[7 * (i - 1) + 6] = at
    out[7 * (i - 1) + 7] = mark
  end
  return out
end

return reply
