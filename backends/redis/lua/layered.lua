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
-- The calling convention (KEYS, ARGV, modes, replies, errors) and the
-- stored encodings are documented, and encoded and decoded, in the crate
-- tollgate-redis-protocol; the native module speaks it too. In short:
--
-- KEYS[i]  the state of layer i (distinct keys).
-- ARGV[1]  the caller's time in µs, or "" for the server's TIME;
-- ARGV[2]  with a caller's time, the largest allowed skew in µs, or "".
-- ARGV[3 + 5(i−1) ..] layer i: algorithm code, cost, p1, p2, p3 (each
--          algorithm's file names its code's parameters).
-- A last ARGV may name a mode: 'reserve', 'peek', 'reset', 'penalize',
--   'reward', 'block' (the cost holds the block's length in µs), or
--   'refund' (7 arguments per layer: the 5, then the charge's at, mark),
--   or 'renew' (7 per layer: the 5, then a concurrency hold's at, 0).
-- Reply: 5 integers per layer (allowed, limit, remaining, reset_after µs,
--   retry_after µs or −1); 'reserve' appends at and mark; 'refund'
--   answers what each layer got back; 'renew' each hold's new at (0: lost). Adjustments answer each layer's
--   peek afterwards, and write what tollgate_algorithms::adjust writes,
--   TTL included (adjusted_ttl below).
-- Errors: "TOLLGATE_CONFLICT <i> not_a_state", Redis's WRONGTYPE,
--   "TOLLGATE_SKEW <caller> <server> <max skew>", "TOLLGATE_TIME <µs>",
--   "TOLLGATE_ARGS <why>";
--   nothing is written then.

-- Every layer is judged against its current state first. Only if every layer
-- admits is every layer written, each with its TTL (SET PX / PEXPIRE, so no
-- key ever lacks one). The TTL set is the algorithm's (milliseconds, rounded
-- up, at least 1) plus one millisecond: Redis counts a relative TTL from its
-- clock truncated to the millisecond, so "PX n" lives between n − 1 and n ms
-- (and "PX 1" can expire at once); the extra millisecond keeps every state
-- until the algorithm says it is as good as new, never shorter. Otherwise no state is written (a denying
-- layer's TTL may be lengthened: keep_denied), and the layers that
-- admitted report remaining + cost (capped at the limit): the request was not
-- charged (Rust: Verdict::uncharged).

-- The tables src/script.rs generates before this file, by algorithm code:
-- ALGORITHMS (every algorithm's function), and for the algorithms kept as
-- counter cells REFUNDS, REWARDS, CHARGES (each algorithm's file:
-- refund_*, reward_*, charge_*), CELLS (how many cells its state keeps)
-- and TIME_CELL (the cell holding a time, from 1). The algorithms kept
-- as a log (the sliding log, the concurrency limit: LOGS) have branches
-- of their own (`LOGS[code]`); TEXT_LOGS names those kept as one string
-- rather than a list (the concurrency limit).
-- Counter states are stored as their cells (trailing cells an algorithm
-- does not use are not written; nor are trailing cells after the time
-- cell that are 0), read back by a pattern and written by a format (one
-- string.format per state).
local PATTERNS = { '^(%d+)$', '^(%d+) (%d+)$', '^(%d+) (%d+) (%d+)$' }
local FORMATS = { '%d', '%d %d', '%d %d %d' }
-- A token bucket or GCRA outside a plan is one integer (the other cells
-- 0), which Redis keeps inside the key's object.

-- The time cell (µs since the Unix epoch), which a state Tollgate wrote
-- always has within EARLIEST..LATEST (generated before this file from
-- tollgate-redis-protocol's STORED_TIMES): a value whose time is not is
-- someone else's numbers.
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
-- PUSH_CHUNK (entries per RPUSH: Lua's unpack has a stack limit),
-- TTL_MARGIN_MS (added to every TTL: Redis's millisecond truncation, see
-- above) and the strides LAYER_ARGS, REFUND_LAYER_ARGS, REPLY_FIELDS and
-- RESERVE_FIELDS are generated before this file, as EARLIEST and LATEST
-- are.

-- Per-layer results of the call being decided. Loaded as a function
-- library these tables are made once and reused by every call (Redis runs
-- one call at a time); as a script they are made once per call.
local codes, ttls, cell_a, cell_b, cell_c = {}, {}, {}, {}, {}

-- A layer's algorithm code (its first argument) and whether its state
-- keeps units across a change of rate: the code plus KEEPS_UNITS (Rust:
-- Limit::keeping_units; each algorithm's file says what it records).
local function layer_code(raw)
  local code = tonumber(raw)
  if code and code >= KEEPS_UNITS then
    return code - KEEPS_UNITS, true
  end
  return code, false
end

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
-- What each algorithm's cells must hold besides a time in range (Rust:
-- each reference's within_reach): counts below 2^53, a recorded rate, a
-- calendar span.
local UNDERSTOOD = {
  [TOKEN_BUCKET] = token_bucket_understood,
  [GCRA] = gcra_understood,
  [FIXED_WINDOW] = fixed_window_understood,
  [SLIDING_WINDOW] = sliding_window_understood,
  [CALENDAR] = calendar_understood,
}

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
  local understood = UNDERSTOOD[code]
  if understood and not understood(a, b, c) then
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
  redis.call('SET', key, format(FORMATS[n], a, b, c), 'PX', int(ttl))
end

-- Logs kept as text (TEXT_LOGS: a concurrency limit's holders, released
-- in any order): one string of timestamps, oldest first, each
-- LOG_ENTRY_DIGITS digits (as every stored time has), separated by one
-- space. Entry i starts at byte (i − 1) × STRIDE + 1, so a decision reads
-- only the entries it looks at, and every edit cuts the string at entry
-- boundaries: one GET and one SET, where a list takes a command per edit.
-- A log of more than TEXT_LOG_MAX entries is kept as a list instead (a
-- long string costs Lua's garbage collector in proportion to its bytes):
-- every write of such a log applies that rule (settle_holders).
local STRIDE = LOG_ENTRY_DIGITS + 1

-- Entries i..j of the log text v ('' when i > j).
local function text_entries(v, i, j)
  if i > j then
    return ''
  end
  return sub(v, (i - 1) * STRIDE + 1, j * STRIDE - 1)
end

-- Two runs of entries as one.
local function text_join(a, b)
  if a == '' then
    return b
  end
  if b == '' then
    return a
  end
  return a .. ' ' .. b
end

-- `count` entries of the time t.
local function text_stamps(t, count)
  if count == 1 then
    return int(t)
  end
  return sub(rep(' ' .. int(t), count), 2)
end

local function no_entry()
  return nil
end

-- A run of digits longer than an entry (set on first use: `rep` is bound
-- by the first call).
local too_long

-- Whether the text v of n entries' length is digits and single spaces
-- alone, in n runs none longer than an entry: each entry is then
-- LOG_ENTRY_DIGITS digits (three scans in C; a check of every character
-- in Lua cost more than the rest of a decision).
local function entries_only(v, n)
  too_long = too_long or rep('%d', STRIDE)
  if find(v, '[^%d ]') or find(v, too_long) then
    return false
  end
  local _, spaces = gsub(v, ' ', ' ')
  return spaces == n - 1
end

-- The log kept as text in the string v (nil: the key is missing), as
-- read_log answers it, with its `text`; false when v is no such log. Its
-- length, its characters, its ends and the order of every entry are
-- checked, as the module checks them (a text log is short; a list's
-- entries between its ends are not read).
local function text_log(v)
  if not v then
    return { n = 0, text = '', at = no_entry }
  end
  local u = block_end(v)
  if u then
    return { n = 0, text = '', blocked = u, at = no_entry }
  end
  local len = #v
  if (len + 1) % STRIDE ~= 0 then
    return false
  end
  local n = (len + 1) / STRIDE
  local log = {
    n = n,
    text = v,
    at = function(i)
      local from = (i - 1) * STRIDE + 1
      return tonumber(sub(v, from, from + LOG_ENTRY_DIGITS - 1))
    end,
  }
  -- (tonumber alone would take ' 12', '1e5' or '0x1f'.)
  local first = tonumber(match(sub(v, 1, LOG_ENTRY_DIGITS), '^%d+$'))
  local last = tonumber(match(sub(v, -LOG_ENTRY_DIGITS), '^%d+$'))
  if not (first and last) or first < EARLIEST or last >= LATEST or first > last then
    return false
  end
  if not entries_only(v, n) then
    return false
  end
  -- Oldest first, every entry: entries of one width compare as text.
  local previous = sub(v, 1, LOG_ENTRY_DIGITS)
  for i = 2, n do
    local from = (i - 1) * STRIDE + 1
    local entry = sub(v, from, from + LOG_ENTRY_DIGITS - 1)
    if entry < previous then
      return false
    end
    previous = entry
  end
  return log
end

-- A list log's entry as a time: plain digits only (tonumber alone would
-- take ' 12', '1e5' or '0x1f'); nil for anything else.
local function list_entry(v)
  return v and tonumber(match(v, '^%d+$'))
end

-- Whether this call reads every entry of a list log (set by decide for
-- each call): all but a one-layer decision, reservation or peek, which
-- read only the entries they look at (the module's rule too).
local whole_logs = true

-- An entry of a list log as a time within EARLIEST..LATEST, else nil.
local function time_entry(v)
  local t = list_entry(v)
  if t and t >= EARLIEST and t < LATEST then
    return t
  end
  return nil
end

-- A log of n entries read one at a time through raw(i) (an item of the
-- list, or nil), each parsed once; an entry that is not a time in range
-- marks the log `foreign` (and reads as EARLIEST, so the decision runs to
-- its end): the caller answers a conflict before anything is written.
local function entry_by_entry(n, raw)
  local seen = {}
  local log = { n = n }
  log.at = function(i)
    local v = seen[i]
    if not v then
      v = time_entry(raw(i))
      if not v then
        log.foreign = true
        v = EARLIEST
      end
      seen[i] = v
    end
    return v
  end
  return log
end

-- The log in the list at `key`, as read_log answers it. Another type
-- fails the LLEN with WRONGTYPE. Every entry read must be a time in
-- range, and the ends in order, as a text log's are: a list of other
-- numbers is someone else's (false). A call that reads logs whole
-- (whole_logs) checks every entry; a one-layer decision, reservation or
-- peek checks the entries it reads (entry_by_entry), as the module does.
local function read_list_log(key)
  local n = redis.call('LLEN', key)
  local log
  if n <= READ_WHOLE or whole_logs then
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
    log = entry_by_entry(n, function(i) return items[i] end)
    if whole_logs then
      for i = 1, n do
        log.at(i)
      end
    end
  else
    log = entry_by_entry(n, function(i) return redis.call('LINDEX', key, int(i - 1)) end)
  end
  if n > 0 then
    local first, last = log.at(1), log.at(n)
    if log.foreign or first > last then
      return false
    end
  end
  return log
end

-- A log as { n, at(i) } (n = 0 when the key is missing; for a block n = 0
-- and `blocked` its end), or false when the key holds a log whose ends
-- are not timestamps. Another type fails the LLEN (or GET) with
-- WRONGTYPE, as for counter states. `got`: what a GET of the key (as a
-- pcall) answered, when the caller asked already.
local function read_log(key, code, got)
  if TEXT_LOGS[code] then
    local v = got
    if v == nil then
      v = redis.pcall('GET', key)
    end
    if type(v) ~= 'table' then
      return text_log(v or nil)
    end
    -- WRONGTYPE: a long log, kept as a list (another type fails the LLEN
    -- the same way).
  end
  return read_list_log(key)
end

-- Append `count` entries of the time t to the list at `key`,
-- PUSH_CHUNK at a time.
local function push_stamps(key, t, count)
  local stamp = int(t)
  local left = count
  while left > 0 do
    local chunk = min(left, PUSH_CHUNK)
    local args = {}
    for j = 1, chunk do
      args[j] = stamp
    end
    redis.call('RPUSH', key, unpack(args))
    left = left - chunk
  end
end

-- A concurrency limit's list after an edit: back to text once it holds
-- TEXT_LOG_MAX entries or fewer, and living `ttl` ms (nil: the caller
-- sets it in this same call).
local function settle_holders(key, ttl)
  local n = redis.call('LLEN', key)
  if n > 0 and n <= TEXT_LOG_MAX then
    local v = concat(redis.call('LRANGE', key, 0, -1), ' ')
    if ttl then
      redis.call('SET', key, v, 'PX', int(ttl))
    else
      redis.call('SET', key, v)
    end
  elseif n > 0 and ttl then
    redis.call('PEXPIRE', key, int(ttl))
  end
end

-- A log kept as text that grows past TEXT_LOG_MAX: its entries i..n
-- moved into a list at `key`.
local function text_to_list(key, log, i)
  redis.call('DEL', key)
  local args = {}
  for k = i, log.n do
    args[#args + 1] = text_entries(log.text, k, k)
    if #args == PUSH_CHUNK or k == log.n then
      redis.call('RPUSH', key, unpack(args))
      args = {}
    end
  end
end

local function write_log(key, next, cost, ttl)
  local log = next.log
  if log and log.text then
    if log.n - next.drop + cost <= TEXT_LOG_MAX then
      local v = text_join(text_entries(log.text, next.drop + 1, log.n), text_stamps(next.t, cost))
      redis.call('SET', key, v, 'PX', int(ttl))
      return
    end
    text_to_list(key, log, next.drop + 1)
    push_stamps(key, next.t, cost)
    redis.call('PEXPIRE', key, int(ttl))
    return
  end
  if next.clear then
    -- The list held a block that has ended.
    redis.call('DEL', key)
  elseif next.drop > 0 then
    redis.call('LTRIM', key, int(next.drop), -1)
  end
  push_stamps(key, next.t, cost)
  if next.textual then
    settle_holders(key, ttl)
  else
    redis.call('PEXPIRE', key, int(ttl))
  end
end

-- A concurrency limit's log at `key` for a release or renewal, which must
-- not fail: nil when the key is missing, holds no entry, or holds anything
-- but such a log (another type's WRONGTYPE is caught). `v` is what a GET
-- of the key answered, when the caller asked already.
local function held_log(key, v)
  if v == nil then
    v = redis.pcall('GET', key)
  end
  local log
  if type(v) == 'string' then
    log = text_log(v)
  elseif type(v) == 'table' and redis.call('TYPE', key)['ok'] == 'list' then
    log = read_list_log(key)
  end
  if not log or log.blocked or log.n == 0 then
    return nil
  end
  return log
end

-- What a refund finds at a key: 'none', 'state' or 'foreign' (another
-- type, checked with TYPE: refunds are rare, and must not fail).
local function refund_target(key, code)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return 'none'
  end
  if (LOGS[code] and kind == 'list') or (not LOGS[code] and kind == 'string') then
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
-- Layer i's arguments in a refund or renewal: its code, cost, three
-- parameters, and the charge's (or hold's) at and mark; the code alone
-- when it is in `own` (a caller that reads the rest itself, each only
-- when needed).
local function charge_args(ARGV, i, own)
  local base = 2 + REFUND_LAYER_ARGS * (i - 1)
  local code, keep = layer_code(ARGV[base + 1])
  if own and own[code] then
    return code
  end
  local n = {}
  for j = 2, REFUND_LAYER_ARGS do
    n[j] = tonumber(ARGV[base + j])
  end
  return code, n[2], n[3], n[4], n[5], n[6], n[7], keep
end

-- The entries of `log` equal to `at` (a run, the log being sorted): the
-- counts of entries before it and up to its end (Rust: partition_point).
local function run_of(log, at)
  local function first(pred)
    local lo, hi = 0, log.n
    while lo < hi do
      local mid = fdiv(lo + hi, 2)
      if pred(log.at(mid + 1)) then
        lo = mid + 1
      else
        hi = mid
      end
    end
    return lo
  end
  return first(function(e) return e < at end), first(function(e) return e <= at end)
end

-- `log` (kept as text at `key`) without up to `cost` of its entries
-- equal to `at`, newest first (a list's LREM key -cost at), or nil when
-- none is there.
local function text_without(log, cost, at)
  local before, through = run_of(log, at)
  local k = min(cost, through - before)
  if k < 1 then
    return nil, 0
  end
  return text_join(text_entries(log.text, 1, through - k), text_entries(log.text, through + 1, log.n)), k
end

-- Store the log kept as text `v` at `key` until its newest entry's lease
-- ends (an empty log: the key goes).
local function write_held(key, v, lease, now)
  if v == '' then
    redis.call('DEL', key)
    return
  end
  local newest = tonumber(sub(v, -LOG_ENTRY_DIGITS))
  redis.call('SET', key, v, 'PX', int(ttl_ms(newest + lease, now) + TTL_MARGIN_MS))
end

-- A concurrency limit's release (Rust: tollgate_algorithms::release): the
-- hold's entries go (refund_sliding_log's rule), and the log lives until
-- its newest entry's lease ends. Answers the entries removed. Layer i's
-- arguments are read here, each only when needed: a release is mostly a
-- GET and a DEL, and each tonumber costs about as much as either.
local function release_holders(key, ARGV, i, now)
  local base = 2 + REFUND_LAYER_ARGS * (i - 1)
  local cost, at_text = tonumber(ARGV[base + 2]), ARGV[base + 6]
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and v == at_text and #v == LOG_ENTRY_DIGITS and cost >= 1 then
    -- The log is this hold's one entry alone (the usual case: one
    -- holder at a time), compared as text, once it is known to be one.
    local at = tonumber(match(v, '^%d+$'))
    if at and at >= EARLIEST and at < LATEST then
      redis.call('DEL', key)
      return 1
    end
  end
  local log = held_log(key, v)
  if not log then
    return 0
  end
  local lease, at = tonumber(ARGV[base + 4]), tonumber(at_text)
  if not log.text then
    local given = redis.call('LREM', key, -cost, int(at))
    local newest = tonumber(redis.call('LINDEX', key, -1))
    if given > 0 and newest then
      settle_holders(key, ttl_ms(newest + lease, now) + TTL_MARGIN_MS)
    end
    return given
  end
  local rest, given = text_without(log, cost, at)
  if not rest then
    return 0
  end
  write_held(key, rest, lease, now)
  return given
end

local function refund(KEYS, ARGV, now)
  local reply = {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    local code, cost, p1, p2, p3, at, mark, keep = charge_args(ARGV, i, TEXT_LOGS)
    reply[i] = 0
    if TEXT_LOGS[code] then
      reply[i] = release_holders(key, ARGV, i, now)
    elseif LOGS[code] then
      -- A list Tollgate did not write is left alone.
      if refund_target(key, code) == 'state' and read_log(key, code) then
        reply[i] = refund_sliding_log(key, cost, at)
      end
    else
      local run = REFUNDS[code]
      if not run then
        local raw = ARGV[2 + REFUND_LAYER_ARGS * (i - 1) + 1]
        return redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(raw))
      end
      if refund_target(key, code) == 'state' then
        local a, b, c = read_cells(key, code)
        -- The state keeps its expiry: a refund only brings it closer to
        -- new. A key without one is left alone (nothing is stored without
        -- a TTL).
        local ttl = redis.call('PTTL', key)
        if a and a ~= BLOCKED and ttl > 0 then
          local given, na, nb, nc = run(p1, p2, p3, a, b, c, now, cost, at, mark, keep)
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

-- Renewals of concurrency holds. Each layer's arguments end with the
-- hold's at (the time its entries were written) and 0; the reply is,
-- per layer, the time they were moved to, or 0 when the hold is lost
-- (Rust: tollgate_algorithms::renew). A hold still live — its entries
-- younger than the lease at t = max(now, newest), all `cost` of them
-- there — moves to t, and the log's TTL to one lease after t; a lost
-- one writes nothing (what is left of it ages out).
local function renew(KEYS, ARGV, now)
  local reply = {}
  for i = 1, #KEYS do
    local key = KEYS[i]
    local code, cost, _, lease, _, at = charge_args(ARGV, i)
    reply[i] = 0
    local log = TEXT_LOGS[code] and held_log(key)
    if log and cost > 0 then
      local t = max(now, log.at(log.n))
      local before, through = run_of(log, at)
      if at + lease > t and through - before >= cost then
        if log.text then
          write_held(key, text_join(text_without(log, cost, at), text_stamps(t, cost)), lease, now)
        else
          redis.call('LREM', key, -cost, int(at))
          push_stamps(key, t, cost)
          settle_holders(key, ttl_ms(t + lease, now) + TTL_MARGIN_MS)
        end
        reply[i] = t
      end
    end
  end
  return reply
end

-- Judge layer i (its key, algorithm code, whether it keeps units, and its
-- cost; its three parameters are ARGV[p], ARGV[p + 1], ARGV[p + 2]) at
-- `now`: admitted (1/0), limit,
-- remaining, reset_after, retry_after, and when admitted the TTL and the
-- next state (cells a, b, c; for the log, its write in a). On a bad
-- argument or a foreign value: nil and the error reply.
local function judge(i, key, code, keep, cost, ARGV, p, now, got)
  local run = ALGORITHMS[code]
  if not run then
    return nil, redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(ARGV[p - 2]))
  end
  local p1, p2, p3 = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
  local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c
  if LOGS[code] then
    local log = read_log(key, code, got)
    if log == false then
      -- Nothing has been written yet: the whole call changes nothing.
      return nil, redis.error_reply('TOLLGATE_CONFLICT ' .. i .. ' not_a_state')
    end
    if log.blocked and log.blocked > now then
      return 0, p1, 0, log.blocked - now, log.blocked - now
    end
    ok, limit, remaining, reset_after, retry_after, a, ttl = run(p1, p2, p3, log, now, cost)
    if log.foreign then
      return nil, redis.error_reply('TOLLGATE_CONFLICT ' .. i .. ' not_a_state')
    end
    if ok then
      a.log = log
      a.clear = log.blocked ~= nil
      a.textual = TEXT_LOGS[code]
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
      run(p1, p2, p3, a, b, c, now, cost, keep)
  end
  return ok and 1 or 0, limit, remaining, reset_after, retry_after, ttl, a, b, c
end

-- A denial writes no state, but keeps the state at `key` until the
-- verdict's reset, `reset_after` µs from `now` (Rust:
-- tollgate_algorithms::kept_by_denial): a policy changed since the
-- state's last write (a longer window) counts it for longer than its TTL
-- says. Under an unchanged policy the TTL is that long already, and
-- nothing is written; a missing key, or one without a TTL, is left alone.
local function keep_denied(key, reset_after, now)
  local need = ttl_ms(now + reset_after, now)
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 and pttl < need then
    redis.call('PEXPIRE', key, int(need + TTL_MARGIN_MS))
  end
end

-- A concurrency limit's acquire (one layer) decided as on a key that
-- holds nothing (the usual case: its last holder released it) and
-- written with SET NX GET: when the key held nothing, the reply's
-- fields (ok, limit, remaining, reset_after, retry_after, at); else
-- nothing is written, and the answer is nil and what the key held, as a
-- pcall GET answers it (a string; a list fails with WRONGTYPE), for the
-- caller to decide on. One call where a GET and a SET were two. A
-- server before Redis 7.0, which refuses NX with GET (and sets no
-- REDIS_VERSION_NUM), is not asked: the caller reads the key as before.
local function acquire_if_empty(key, code, cost, ARGV, now)
  if (redis.REDIS_VERSION_NUM or 0) < 0x070000 then
    return nil, nil
  end
  local p1, p2, p3 = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  if not (cost and p1 and p2 and p3) then
    -- Arguments that are not numbers: the caller answers them as before
    -- (after reading the key: foreign data is a conflict first).
    return nil, nil
  end
  local ok, limit, remaining, reset_after, retry_after, next, ttl =
    ALGORITHMS[code](p1, p2, p3, text_log(nil), now, cost)
  if not ok or cost < 1 or cost > TEXT_LOG_MAX then
    return nil, nil
  end
  local got = redis.pcall('SET', key, text_stamps(next.t, cost), 'NX', 'GET', 'PX', int(ttl + TTL_MARGIN_MS))
  if type(got) == 'table' and sub(got['err'] or '', 1, 9) ~= 'WRONGTYPE' then
    -- Refused for another reason (out of memory): nothing was written.
    return nil, nil
  end
  if got then
    return nil, got
  end
  return { 1, limit, remaining, reset_after, retry_after, next.t }
end

-- The end of the block at layer i's key when it is still on, else nil.
local function live_block(key, code, now)
  local u
  if LOGS[code] then
    local log = read_log(key, code)
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
  if LOGS[code] and not TEXT_LOGS[code] then
    redis.call('DEL', key)
    redis.call('RPUSH', key, v)
    redis.call('PEXPIRE', key, int(ttl))
  else
    redis.call('SET', key, v, 'PX', int(ttl))
  end
end

-- The TTL of a state an adjustment wrote (Rust: tollgate_algorithms::adjust):
-- until a request of one unit would find it full again (its
-- `reset_after`), and never shorter than a penalty's charge gave it
-- (`charged`, ms; 0 for a reward).
local function adjusted_ttl(reset_after, now, charged)
  return max(ttl_ms(now + reset_after, now), charged) + TTL_MARGIN_MS
end

-- Write counter cells an adjustment made, with adjusted_ttl: the cells
-- are peeked first for their reset_after.
local function write_adjusted(key, code, p1, p2, p3, now, charged, a, b, c)
  local _, _, _, reset_after = ALGORITHMS[code](p1, p2, p3, a, b, c, now, 1)
  write_cells(key, code, adjusted_ttl(reset_after, now, charged), a, b, c)
end

-- Give `units` back to the state at `key` (each algorithm's reward_*: its
-- refund of a charge that never ages; the log drops its newest entries).
-- Answers true when a log was trimmed (its TTL is set by the caller, once
-- the trimmed log's reset_after is known).
local function reward_layer(key, code, keep, p1, p2, p3, now, units)
  if LOGS[code] then
    -- The newest `units` entries go (a list left empty is removed; a
    -- missing key stays missing; a live block was kept by the caller, and
    -- an ended one is no state: nothing to give back).
    local log = read_log(key, code)
    if not log or log.blocked or log.n == 0 or units < 1 then
      return false
    end
    if log.text then
      local v = text_entries(log.text, 1, log.n - units)
      if v == '' then
        redis.call('DEL', key)
      else
        -- Its TTL is set by the caller, in this same call.
        redis.call('SET', key, v)
      end
      return true
    end
    redis.call('LTRIM', key, 0, int(-(units + 1)))
    if TEXT_LOGS[code] then
      settle_holders(key, nil)
    end
    return true
  end
  local a, b, c = read_cells(key, code)
  if not a or a == BLOCKED then
    return false
  end
  local given, na, nb, nc = REWARDS[code](p1, p2, p3, a, b, c, now, units, keep)
  if na and given > 0 then
    write_adjusted(key, code, p1, p2, p3, now, 0, na, nb, nc)
  end
  return false
end

-- Charge what layer i has left, up to `units`, as an admitted decision
-- (saturating at empty). Answers the charge's TTL (ms) when a log was
-- written (its TTL is set by the caller, as for a reward).
local function penalize_layer(i, key, code, keep, ARGV, p, now, units)
  local ok, _, remaining = judge(i, key, code, keep, 1, ARGV, p, now)
  local take = 0
  if ok == 1 then
    take = min(units, remaining + 1)
  end
  if take == 0 then
    return nil
  end
  local taken, _, _, _, _, ttl, a, b, c = judge(i, key, code, keep, take, ARGV, p, now)
  if taken ~= 1 then
    return nil
  end
  if LOGS[code] then
    write_log(key, a, take, ttl + TTL_MARGIN_MS)
    return ttl
  end
  write_adjusted(key, code, tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]),
    now, ttl, a, b, c)
  return nil
end

-- 'penalize', 'reward' and 'block' (see the modes above).
local function adjust(KEYS, ARGV, now, mode)
  local layers = #KEYS
  -- A block's length is the same for every layer (the module, through
  -- tollgate_algorithms::adjust_layers, takes one).
  for i = 2, layers do
    if mode == 'block' and ARGV[2 + LAYER_ARGS * (i - 1) + 2] ~= ARGV[2 + 2] then
      return redis.error_reply("TOLLGATE_ARGS a block's length must be the same for every layer")
    end
  end
  -- Every key judged first: a foreign one fails the call unchanged.
  for i = 1, layers do
    local base = 2 + LAYER_ARGS * (i - 1)
    local code, keep = layer_code(ARGV[base + 1])
    local ok, err = judge(i, KEYS[i], code, keep, 1, ARGV, base + 3, now)
    if not ok then
      return err
    end
  end
  local reply = {}
  for i = 1, layers do
    local key = KEYS[i]
    local base = 2 + LAYER_ARGS * (i - 1)
    local code, keep = layer_code(ARGV[base + 1])
    local units = tonumber(ARGV[base + 2])
    local p = base + 3
    local blocked = live_block(key, code, now)
    -- A log an adjustment wrote: the charge's TTL (0 for a reward).
    local log_charged = nil
    if mode == 'block' then
      local until_us = now + units
      if blocked and blocked > until_us then
        until_us = blocked
      end
      write_block(key, code, until_us, now)
    elseif blocked then
      -- A block is kept through penalties and rewards.
    elseif mode == 'penalize' then
      log_charged = penalize_layer(i, key, code, keep, ARGV, p, now, units)
    elseif reward_layer(key, code, keep, tonumber(ARGV[p]), tonumber(ARGV[p + 1]),
        tonumber(ARGV[p + 2]), now, units) then
      log_charged = 0
    end
    local ok, limit, remaining, reset_after, retry_after = judge(i, key, code, keep, 1, ARGV, p, now)
    if log_charged then
      -- (A list the reward emptied is gone: PEXPIRE does nothing.)
      redis.call('PEXPIRE', key, int(adjusted_ttl(reset_after, now, log_charged)))
    end
    if ok == 1 then
      remaining = min(remaining + 1, limit)
    end
    local r = REPLY_FIELDS * (i - 1)
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
  if nargs ~= 2 + LAYER_ARGS * layers then
    local last = ARGV[nargs]
    if nargs == 3 + LAYER_ARGS * layers and (last == 'reserve' or last == 'peek' or last == 'reset'
        or last == 'penalize' or last == 'reward' or last == 'block') then
      mode = last
    elseif nargs == 3 + REFUND_LAYER_ARGS * layers and (last == 'refund' or last == 'renew') then
      mode = last
    else
      return redis.error_reply('TOLLGATE_ARGS expected 2 arguments and 5 per key (or a mode name last, and 7 per key for refund and renew)')
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

  -- A time before 2020 or after 2100 (a server's clock reset to 1970, a
  -- caller's past the checks of its store) would write states read
  -- later as someone else's data (Rust: Timestamp::is_plausible).
  if now < EARLIEST or now > LATEST_CLOCK then
    return redis.error_reply('TOLLGATE_TIME ' .. int(now))
  end
  whole_logs = not (layers == 1 and (mode == 'decide' or mode == 'reserve' or mode == 'peek'))
  if mode == 'refund' then
    return refund(KEYS, ARGV, now)
  end
  if mode == 'renew' then
    return renew(KEYS, ARGV, now)
  end
  if mode == 'penalize' or mode == 'reward' or mode == 'block' then
    return adjust(KEYS, ARGV, now, mode)
  end

  if layers == 1 and (mode == 'decide' or mode == 'reserve') then
    -- One layer (most decisions, a concurrency limit's acquire): no
    -- per-layer bookkeeping.
    local code, keep = layer_code(ARGV[3])
    local got
    if TEXT_LOGS[code] then
      local acquired
      acquired, got = acquire_if_empty(KEYS[1], code, tonumber(ARGV[4]), ARGV, now)
      if acquired then
        if mode == 'reserve' then
          acquired[7] = 0
          return acquired
        end
        acquired[6] = nil
        return acquired
      end
    end
    local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c =
      judge(1, KEYS[1], code, keep, tonumber(ARGV[4]), ARGV, 5, now, got)
    if not ok then
      return limit
    end
    local at, mark = 0, 0
    if ok == 1 then
      if LOGS[code] then
        write_log(KEYS[1], a, tonumber(ARGV[4]), ttl + TTL_MARGIN_MS)
        at = a.t
      else
        write_cells(KEYS[1], code, ttl + TTL_MARGIN_MS, a, b, c)
        if mode == 'reserve' then
          at, mark = CHARGES[code](a, b, c)
        end
      end
    else
      keep_denied(KEYS[1], reset_after, now)
    end
    if mode == 'reserve' then
      return { ok, limit, remaining, reset_after, retry_after, at, mark }
    end
    return { ok, limit, remaining, reset_after, retry_after }
  end

  local reply = {}
  local all_allowed = true
  for i = 1, layers do
    local base = 2 + LAYER_ARGS * (i - 1)
    local code, keep = layer_code(ARGV[base + 1])
    local ok, limit, remaining, reset_after, retry_after, ttl, a, b, c =
      judge(i, KEYS[i], code, keep, tonumber(ARGV[base + 2]), ARGV, base + 3, now)
    if not ok then
      return limit
    end
    codes[i], ttls[i], cell_a[i], cell_b[i], cell_c[i] = code, ttl, a, b, c
    if ok == 0 then
      all_allowed = false
    end
    local r = REPLY_FIELDS * (i - 1)
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
      if LOGS[code] then
        write_log(KEYS[i], cell_a[i], tonumber(ARGV[2 + LAYER_ARGS * (i - 1) + 2]), ttls[i] + TTL_MARGIN_MS)
      else
        write_cells(KEYS[i], code, ttls[i] + TTL_MARGIN_MS, cell_a[i], cell_b[i], cell_c[i])
      end
    end
  else
    -- Nothing was charged: admitting layers give the cost back, and a
    -- decision's denying layers keep their states.
    for i = 1, layers do
      local r = REPLY_FIELDS * (i - 1)
      if reply[r + 1] == 1 then
        local cost = tonumber(ARGV[2 + LAYER_ARGS * (i - 1) + 2])
        reply[r + 3] = min(reply[r + 3] + cost, reply[r + 2])
      elseif mode == 'decide' or mode == 'reserve' then
        keep_denied(KEYS[i], reply[r + 4], now)
      end
    end
  end

  if mode == 'reserve' then
    -- Append each layer's charge (at, mark), as refund_* expect them.
    local out = {}
    for i = 1, layers do
      local r = REPLY_FIELDS * (i - 1)
      for j = 1, REPLY_FIELDS do
        out[RESERVE_FIELDS * (i - 1) + j] = reply[r + j]
      end
      local at, mark = 0, 0
      if all_allowed then
        local code = codes[i]
        if LOGS[code] then
          at = cell_a[i].t
        else
          at, mark = CHARGES[code](cell_a[i], cell_b[i], cell_c[i])
        end
      end
      out[RESERVE_FIELDS * (i - 1) + REPLY_FIELDS + 1] = at
      out[RESERVE_FIELDS * (i - 1) + REPLY_FIELDS + 2] = mark
    end
    return out
  end

  return reply
end

