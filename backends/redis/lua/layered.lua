-- Tollgate: decide every layer of one request in one call, all-or-nothing.
--
-- common.lua, the algorithm codes, the algorithm files, the tables that
-- find each algorithm's functions by its code, and this dispatcher are
-- concatenated in that order (src/script.rs, which generates the codes and
-- tables from the Rust list of built-ins) into one body that defines
-- `decide(KEYS, ARGV)`. On Redis 7 the store loads the body as a function
-- library (FUNCTION LOAD, then FCALL), so the helpers and tables are made
-- once per load; elsewhere, or when asked to, it runs the same body as a
-- script (EVALSHA) ending in `return decide(KEYS, ARGV)`. Each
-- algorithm lives in exactly one file; a single-policy decision is this
-- same code with one layer, so there is one source of truth per algorithm.
--
-- KEYS[i]  the state of layer i (distinct keys).
-- ARGV[1]  the caller's time in µs since the Unix epoch, or "" to read the
--          server's TIME (the default: one clock for every key).
-- ARGV[2]  with a caller's time: the largest allowed distance in µs from the
--          server's TIME, or "" for no check.
-- ARGV[3 + 5(i−1) ..] layer i: algorithm code, cost, p1, p2, p3 (each
--          algorithm's file names its code's parameters; p1 is its
--          capacity, which a blocked layer reports as its limit)
--
-- Reply: 5 integers per layer, in KEYS order: allowed (1/0), limit,
--   remaining, reset_after µs, retry_after µs (−1 when the layer admits).
--
-- Modes, for the Redis Cluster store (src/cluster.rs), which decides the
-- keys of each hash slot in one call: a last ARGV after the layers selects
-- one. Without it the script decides as above (the standalone store).
--   'reserve'  decide as above; the reply has 7 integers per layer: the 5,
--              then what the charge needs to be refunded: the effective
--              time it charged at (µs; token bucket: the remainder it wrote;
--              GCRA: 0) and a mark (token bucket: when full again, as
--              written; GCRA: the TAT written; otherwise 0);
--              0 0 when nothing was charged.
--   'peek'     judge every layer, write nothing; the reply is the one a
--              denial gives (admitting layers report remaining + cost).
--              The standalone store's Store::peek too.
--   'reset'    judge every layer as 'peek' does (so a key holding data
--              Tollgate did not write fails the call before anything is
--              removed), then delete every key; the reply is the peek's.
--   'penalize' 'reward' 'block'
--              an operator's change to every layer (Rust reference:
--              tollgate_algorithms::adjust): every layer is judged first
--              (a foreign key fails the call before anything is written),
--              then each is penalized by its cost (saturating at empty),
--              given its cost back (never above full) or blocked — for a
--              block the cost argument holds the block's length in µs.
--              Reply: each layer's verdict for a request of one unit
--              afterwards, as 'peek' gives it.
--   'refund'   give back reservations (each algorithm's refund_*).
--              KEYS: the layers' keys; ARGV after the time: per layer algorithm, cost, p1, p2,
--              p3, at, mark; then 'refund'. Reply: per layer what was given
--              back. Not idempotent: the store sends a refund at most once.
-- Blocks: a counter key holding "b<µs>", or a list holding that one
--   item, is blocked until that instant whatever the algorithm: denied
--   with it as retry-after; once passed the key counts as no state.
-- Errors: "TOLLGATE_CONFLICT <i> not_a_state" when the i-th key holds a
--   value Tollgate did not write, and Redis's own WRONGTYPE when a key
--   holds another type (the store finds which with TYPE); either way
--   nothing is written and the key is left as it was (a refund gives
--   nothing back from such a key);
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

-- The tables src/script.rs generates before this file, by algorithm code:
-- ALGORITHMS (every algorithm's function), and for the algorithms kept as
-- counter cells REFUNDS, REWARDS, CHARGES (each algorithm's file:
-- refund_*, reward_*, charge_*), CELLS (how many cells its state keeps)
-- and TIME_CELL (the cell holding a time, from 1). The sliding log, kept
-- as a list, has branches of its own (`code == LOG`).
local LOG = SLIDING_LOG
-- Counter states are stored as their cells (trailing cells an algorithm
-- does not use are not written; nor are trailing cells after the time
-- cell that are 0), read back by a pattern and written by a format (one
-- string.format per state).
local PATTERNS = { '^(%d+)$', '^(%d+) (%d+)$', '^(%d+) (%d+) (%d+)$' }
local FORMATS = { '%d', '%d %d', '%d %d %d' }
-- The token bucket leaves its second cell (the remainder) out when it is
-- 0: one integer, which Redis keeps inside the key's object.

-- The time cell (µs since the Unix epoch), which a state
-- Tollgate wrote always has from 2020 to 2101 (clocks are checked to read
-- 2020–2100; a TAT runs ahead by at most the longest recovery, 14 days):
-- a value whose time is not is someone else's numbers.
local EARLIEST, LATEST = 1577836800000000, 4133980800000000
-- What read_cells answers for a block (its second value: the end).
local BLOCKED = -1

-- The end of the block `v` holds ("b<µs>"), or nil when `v` is not one.
local function block_end(v)
  local u = match(v, '^b(%d+)$')
  u = u and tonumber(u)
  if u and u >= EARLIEST and u < LATEST then
    return u
  end
  return nil
end

-- Lists up to this length are read whole; longer ones by binary search
-- with LINDEX, so a large log costs O(log n) reads.
local READ_WHOLE = 64
-- RPUSH at most this many entries per call (Lua's unpack has a stack limit).
local PUSH_CHUNK = 1000
-- Added to every TTL: Redis's millisecond truncation (see above).
local TTL_MARGIN_MS = 1

-- Per-layer results of the call being decided. Loaded as a function
-- library these tables are made once and reused by every call (Redis runs
-- one call at a time); as a script they are made once per call.
local codes, ttls, cell_a, cell_b, cell_c = {}, {}, {}, {}, {}

local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The counter state of algorithm `code` at `key`: its cells as numbers
-- (cells not stored are 0); nil when the key is missing; BLOCKED and
-- its end when the key holds a block; false when the key holds a string
-- that is not such a state (data Tollgate did not
-- write: the caller answers TOLLGATE_CONFLICT without touching the key).
-- A key of another type fails the GET with WRONGTYPE before anything is
-- written, which the store reports as a conflict too (no pcall on this
-- path).
local function read_cells(key, code)
  local v = redis.call('GET', key)
  if not v then
    return nil
  end
  local n, t = CELLS[code], TIME_CELL[code]
  local a, b, c = match(v, PATTERNS[n])
  -- Cells after the time cell may have been left out (0).
  while not a and n > t do
    n = n - 1
    a, b, c = match(v, PATTERNS[n])
  end
  if not a then
    local u = block_end(v)
    if u then
      return BLOCKED, u
    end
    return false
  end
  a, b, c = tonumber(a), tonumber(b or 0), tonumber(c or 0)
  local at = (t == 1 and a) or (t == 2 and b) or c
  if at < EARLIEST or at >= LATEST then
    return false
  end
  return a, b, c
end

local function write_cells(key, code, ttl, a, b, c)
  local n, t = CELLS[code], TIME_CELL[code]
  -- Trailing cells after the time cell that are 0 are left out.
  if n == 3 and t < 3 and c == 0 then
    n = 2
  end
  if n == 2 and t < 2 and b == 0 then
    n = 1
  end
  redis.call('SET', key, format(FORMATS[n], a, b, c), 'PX', ttl)
end

-- A sliding log as { n, at(i) } (n = 0 when the key is missing; for a
-- block n = 0 and `blocked` its end), or false when the key holds a list
-- whose ends are not timestamps. Another type
-- fails the LLEN with WRONGTYPE, as for counter states.
local function read_log(key)
  local n = redis.call('LLEN', key)
  local log
  if n <= READ_WHOLE then
    local items = {}
    if n > 0 then
      items = redis.call('LRANGE', key, 0, -1)
    end
    if n == 1 and not tonumber(items[1]) then
      local u = block_end(items[1])
      if u then
        return { n = 0, blocked = u, at = function() return nil end }
      end
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
    return false
  end
  return log
end

local function write_log(key, next, cost, ttl)
  if next.clear then
    -- The list held a block that has ended.
    redis.call('DEL', key)
  elseif next.drop > 0 then
    redis.call('LTRIM', key, next.drop, -1)
  end
  local stamp = int(next.t)
  local left = cost
  while left > 0 do
    local chunk = min(left, PUSH_CHUNK)
    local args = {}
    for j = 1, chunk do
      args[j] = stamp
    end
    redis.call('RPUSH', key, unpack(args))
    left = left - chunk
  end
  redis.call('PEXPIRE', key, ttl)
end

-- What a refund finds at a key: 'none', 'state' or 'foreign' (another
-- type, checked with TYPE: refunds are rare, and must not fail).
local function refund_target(key, code)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return 'none'
  end
  if (code == LOG and kind == 'list') or (code ~= LOG and kind == 'string') then
    return 'state'
  end
  return 'foreign'
end

-- Refunds (the Cluster store's reservations). Each algorithm's
-- refund_<algorithm>(p1, p2, p3, a, b, c, now, cost, at, mark):
--
-- a, b, c: the stored cells (a nil: no state).
--
-- at    the effective time (µs) the reservation charged at (token bucket:
--       the remainder the charge wrote; GCRA: 0);
-- mark  token bucket: when full again, as the charge wrote it; GCRA: the
--       TAT it wrote; otherwise 0.
-- Returns: what was given back (scaled tokens, µs of TAT, counts, log
--   entries; 0 when nothing), and for counter states the cells to store
--   (a, b, c; none: write nothing).
--
-- A refund never gives back more than the charge took, and never more than
-- the state would hold had the charge not happened: between the charge and
-- the refund, other requests may have been admitted against the charged
-- state, and a bucket that would have been full meanwhile wastes refill.
-- When that cannot be ruled out the refund gives back less (or nothing):
-- a brief under-admission, never an over-admission. A state whose time is
-- before the charge's was recreated since (it expired): nothing to refund.
local function refund(KEYS, ARGV, now)
  local reply = {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    local base = 2 + 7 * (i - 1)
    local code = tonumber(ARGV[base + 1])
    local cost = tonumber(ARGV[base + 2])
    local p1, p2, p3 = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
    local at, mark = tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7])
    reply[i] = 0
    local target = refund_target(key, code)
    if code == LOG then
      -- A list Tollgate did not write is left alone.
      if target == 'state' and read_log(key) then
        reply[i] = refund_sliding_log(key, cost, at)
      end
    else
      local run = REFUNDS[code]
      if not run then
        return redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(ARGV[base + 1]))
      end
      if target == 'state' then
        local a, b, c = read_cells(key, code)
        -- The state keeps its expiry: a refund only brings it closer to
        -- new. A key without one is left alone (nothing is stored without
        -- a TTL).
        local ttl = redis.call('PTTL', key)
        if a and a ~= BLOCKED and ttl > 0 then
          local given, na, nb, nc = run(p1, p2, p3, a, b, c, now, cost, at, mark)
          if na then
            write_cells(key, code, ttl, na, nb, nc)
            reply[i] = given
          end
        end
      end
    end
  end
  return reply
end

-- Judge layer i (its key, algorithm code and cost; its three parameters
-- are ARGV[p], ARGV[p + 1], ARGV[p + 2]) at `now`: admitted (1/0), limit,
-- remaining, reset_after, retry_after, and when admitted the TTL and the
-- next state (cells a, b, c; for the log, its write in a). On a bad
-- argument or a foreign value: nil and the error reply.
local function judge(i, key, code, cost, ARGV, p, now)
  local run = ALGORITHMS[code]
  if not run then
    return nil, redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(ARGV[p - 2]))
  end
  local p1, p2, p3 = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
  local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c
  if code == LOG then
    local log = read_log(key)
    if log == false then
      -- Nothing has been written yet: the whole call changes nothing.
      return nil, redis.error_reply('TOLLGATE_CONFLICT ' .. i .. ' not_a_state')
    end
    if log.blocked and log.blocked > now then
      return 0, p1, 0, log.blocked - now, log.blocked - now
    end
    ok, limit, remaining, reset_after, retry_after, a, ttl = run(p1, p2, p3, log, now, cost)
    if ok and log.blocked then
      a.clear = true
    end
  else
    a, b, c = read_cells(key, code)
    if a == false then
      return nil, redis.error_reply('TOLLGATE_CONFLICT ' .. i .. ' not_a_state')
    end
    if a == BLOCKED then
      if b > now then
        return 0, p1, 0, b - now, b - now
      end
      -- The block has ended: the layer starts new.
      a, b, c = nil, nil, nil
    end
    ok, limit, remaining, reset_after, retry_after, ttl, a, b, c =
      run(p1, p2, p3, a, b, c, now, cost)
  end
  return ok and 1 or 0, limit, remaining, reset_after, retry_after, ttl, a, b, c
end

-- The end of the block at layer i's key when it is still on, else nil.
local function live_block(key, code, now)
  local u
  if code == LOG then
    local log = read_log(key)
    u = log and log.blocked
  else
    local a, b = read_cells(key, code)
    u = a == BLOCKED and b
  end
  if u and u > now then
    return u
  end
  return nil
end

local function write_block(key, code, until_us, now)
  local ttl = ttl_ms(until_us, now) + TTL_MARGIN_MS
  local v = 'b' .. int(until_us)
  if code == LOG then
    redis.call('DEL', key)
    redis.call('RPUSH', key, v)
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('SET', key, v, 'PX', ttl)
  end
end

-- Give `units` back to the state at `key` (each algorithm's reward_*: its
-- refund of a charge that never ages; the log drops its newest entries). A state keeps its
-- expiry: a reward only brings it closer to new.
local function reward_layer(key, code, p1, p2, p3, now, units)
  if code == LOG then
    -- The newest `units` entries go (a list left empty is removed; a
    -- missing key stays missing; a live block was kept by the caller).
    redis.call('LTRIM', key, 0, -(units + 1))
    return
  end
  local a, b, c = read_cells(key, code)
  local ttl = redis.call('PTTL', key)
  if not a or a == BLOCKED or ttl <= 0 then
    return
  end
  local given, na, nb, nc = REWARDS[code](p1, p2, p3, a, b, c, now, units)
  if na and given > 0 then
    write_cells(key, code, ttl, na, nb, nc)
  end
end

-- 'penalize', 'reward' and 'block' (see the modes above).
local function adjust(KEYS, ARGV, now, mode)
  local layers = #KEYS
  -- Every key judged first: a foreign one fails the call unchanged.
  for i = 1, layers do
    local base = 2 + 5 * (i - 1)
    local ok, err = judge(i, KEYS[i], tonumber(ARGV[base + 1]), 1, ARGV, base + 3, now)
    if not ok then
      return err
    end
  end
  local reply = {}
  for i = 1, layers do
    local key = KEYS[i]
    local base = 2 + 5 * (i - 1)
    local code = tonumber(ARGV[base + 1])
    local units = tonumber(ARGV[base + 2])
    local p = base + 3
    local blocked = live_block(key, code, now)
    if mode == 'block' then
      local until_us = now + units
      if blocked and blocked > until_us then
        until_us = blocked
      end
      write_block(key, code, until_us, now)
    elseif blocked then
      -- A block is kept through penalties and rewards.
    elseif mode == 'penalize' then
      local ok, _, remaining = judge(i, key, code, 1, ARGV, p, now)
      local take = 0
      if ok == 1 then
        take = min(units, remaining + 1)
      end
      if take > 0 then
        local taken, _, _, _, _, ttl, a, b, c = judge(i, key, code, take, ARGV, p, now)
        if taken == 1 then
          if code == LOG then
            write_log(key, a, take, ttl + TTL_MARGIN_MS)
          else
            write_cells(key, code, ttl + TTL_MARGIN_MS, a, b, c)
          end
        end
      end
    else
      reward_layer(key, code, tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]),
        now, units)
    end
    local ok, limit, remaining, reset_after, retry_after = judge(i, key, code, 1, ARGV, p, now)
    if ok == 1 then
      remaining = min(remaining + 1, limit)
    end
    local r = 5 * (i - 1)
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] =
      ok, limit, remaining, reset_after, retry_after
  end
  return reply
end

-- The one entry point: KEYS and ARGV as described above.
local function decide(KEYS, ARGV)
  if not floor then
    bind()
  end
  local layers = #KEYS
  local nargs = #ARGV
  local mode = 'decide'
  if nargs ~= 2 + 5 * layers then
    local last = ARGV[nargs]
    if nargs == 3 + 5 * layers and (last == 'reserve' or last == 'peek' or last == 'reset'
        or last == 'penalize' or last == 'reward' or last == 'block') then
      mode = last
    elseif nargs == 3 + 7 * layers and last == 'refund' then
      mode = 'refund'
    else
      return redis.error_reply('TOLLGATE_ARGS expected 2 arguments and 5 per key')
    end
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
      if now - server > max_skew or server - now > max_skew then
        return redis.error_reply('TOLLGATE_SKEW ' .. int(now) .. ' ' .. int(server) .. ' ' .. ARGV[2])
      end
    end
  end

  if mode == 'refund' then
    return refund(KEYS, ARGV, now)
  end
  if mode == 'penalize' or mode == 'reward' or mode == 'block' then
    return adjust(KEYS, ARGV, now, mode)
  end

  if layers == 1 and mode == 'decide' then
    -- One layer (most decisions): no per-layer bookkeeping.
    local code = tonumber(ARGV[3])
    local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c =
      judge(1, KEYS[1], code, tonumber(ARGV[4]), ARGV, 5, now)
    if not ok then
      return limit
    end
    if ok == 1 then
      if code == LOG then
        write_log(KEYS[1], a, tonumber(ARGV[4]), ttl + TTL_MARGIN_MS)
      else
        write_cells(KEYS[1], code, ttl + TTL_MARGIN_MS, a, b, c)
      end
    end
    return { ok, limit, remaining, reset_after, retry_after }
  end

  local reply = {}
  local all_allowed = true
  for i = 1, layers do
    local base = 2 + 5 * (i - 1)
    local code = tonumber(ARGV[base + 1])
    local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c =
      judge(i, KEYS[i], code, tonumber(ARGV[base + 2]), ARGV, base + 3, now)
    if not ok then
      return limit
    end
    codes[i], ttls[i], cell_a[i], cell_b[i], cell_c[i] = code, ttl, a, b, c
    if ok == 0 then
      all_allowed = false
    end
    local r = 5 * (i - 1)
    reply[r + 1] = ok
    reply[r + 2] = limit
    reply[r + 3] = remaining
    reply[r + 4] = reset_after
    reply[r + 5] = retry_after
  end

  -- Peeking writes nothing: report as a denial does. A reset, having
  -- found every key to be a state (or missing), removes them all.
  if mode == 'peek' or mode == 'reset' then
    all_allowed = false
  end
  if mode == 'reset' then
    redis.call('DEL', unpack(KEYS))
  end

  if all_allowed then
    for i = 1, layers do
      local code = codes[i]
      if code == LOG then
        write_log(KEYS[i], cell_a[i], tonumber(ARGV[2 + 5 * (i - 1) + 2]), ttls[i] + TTL_MARGIN_MS)
      else
        write_cells(KEYS[i], code, ttls[i] + TTL_MARGIN_MS, cell_a[i], cell_b[i], cell_c[i])
      end
    end
  else
    -- Nothing was charged: admitting layers give the cost back.
    for i = 1, layers do
      local r = 5 * (i - 1)
      if reply[r + 1] == 1 then
        local cost = tonumber(ARGV[2 + 5 * (i - 1) + 2])
        reply[r + 3] = min(reply[r + 3] + cost, reply[r + 2])
      end
    end
  end

  if mode == 'reserve' then
    -- Append each layer's charge (at, mark), as refund_* expect them.
    local out = {}
    for i = 1, layers do
      local r = 5 * (i - 1)
      for j = 1, 5 do
        out[7 * (i - 1) + j] = reply[r + j]
      end
      local at, mark = 0, 0
      if all_allowed then
        local code = codes[i]
        if code == LOG then
          at = cell_a[i].t
        else
          at, mark = CHARGES[code](cell_a[i], cell_b[i], cell_c[i])
        end
      end
      out[7 * (i - 1) + 6] = at
      out[7 * (i - 1) + 7] = mark
    end
    return out
  end

  return reply
end

