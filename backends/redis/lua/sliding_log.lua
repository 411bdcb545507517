-- Tollgate: sliding log (Rust reference: algorithms/src/sliding_log.rs).
--
-- This file defines the algorithm (`sliding_log`), its refund (`refund_sliding_log`,
-- see layered.lua's refund mode). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `sliding_log`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   sliding_log(limit, window_us, _, log, now, cost)
--
-- Layer ARGV: algorithm 5, cost, limit, window_us, 0.
-- State: a Redis LIST of timestamps (µs, one per admitted unit), oldest
--   first. They never decrease (each write appends at t = max(now, newest)),
--   so the list stays sorted and aged-out entries are trimmed from the left.
--   The function sees it through log.n (length) and log.at(i) (1-based).
-- An entry counts while it lies in (t − W, t].
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the next state as
--   { drop = entries to trim from the left, t = timestamp to append cost
--   times } and the TTL in milliseconds.
local function sliding_log(limit, w, _, log, now, cost)
  local n = log.n
  local t = now
  if n > 0 then
    t = max(now, log.at(n))
  end
  -- Entries at or before t − W have aged out: the first live one, found by
  -- galloping from the oldest end (entries 1, 2, 4, 8, …), then halving
  -- (Rust: partition_point): the aged-out entries are a few of the oldest,
  -- and each entry of a list longer than layered.lua's READ_WHOLE is an
  -- LINDEX.
  local lo, hi = 0, 1
  while hi <= n and log.at(hi) + w <= t do
    lo = hi
    hi = hi * 2
  end
  hi = min(hi - 1, n)
  while lo < hi do
    local mid = fdiv(lo + hi, 2)
    if log.at(mid + 1) + w <= t then
      lo = mid + 1
    else
      hi = mid
    end
  end
  local first_live = lo
  local live = n - first_live
  if live + cost <= limit then
    local reset_at = t + w
    return true, limit, limit - (live + cost), after(reset_at, now), -1,
      { drop = first_live, t = t }, ttl_ms(reset_at, now)
  end
  -- The k-th oldest live entry must age out, k = live + cost − limit.
  local k = live + cost - limit
  local retry_at = log.at(first_live + k) + w
  local reset_at = t
  if n > 0 then
    reset_at = log.at(n) + w
  end
  -- max() only guards a log written under a larger limit.
  return false, limit, max(limit - live, 0), after(reset_at, now), after(retry_at, now)
end

-- Sliding log: the charge appended `cost` entries equal to `at`; entries
-- equal to `at` are interchangeable and age out together, so removing up
-- to `cost` of them (newest first) removes exactly the charge's, or nothing
-- once they aged out.
local function refund_sliding_log(key, cost, at)
  -- The caller checked the key is a list.
  return redis.call('LREM', key, -cost, int(at))
end
