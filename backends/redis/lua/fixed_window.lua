-- Tollgate: fixed window (Rust reference: algorithms/src/fixed_window.rs).
--
-- This file defines one function; the store runs it through layered.lua,
-- which holds the KEYS/ARGV layout (one layer = one call of this function).
--
--   fixed_window(limit, window_us, _, count, last, _, now, cost)
--
-- Layer ARGV: algorithm 3, cost, limit, window_us, 0.
-- State: cells {count, last µs}, stored as the string "a b"; nil: none.
--   The count belongs to the aligned window holding last.
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.
local function fixed_window(limit, w, _, stored, last, _, now, cost)
  if not stored then
    stored, last = 0, now
  end
  local t = max(now, last)
  local start = t - mod(t, w)
  local count = 0
  if last >= start then
    count = stored
  end
  local stop = start + w
  local allowed = count + cost <= limit
  local count_after = count
  if allowed then
    count_after = count + cost
  end
  local reset_after = after(stop, now)
  if count_after == 0 then
    reset_after = after(t, now)
  end
  -- max() only guards a count written under a larger limit.
  local remaining = max(limit - count_after, 0)
  if allowed then
    return true, limit, remaining, reset_after, -1, ttl_ms(stop, now), count_after, t, 0
  end
  return false, limit, remaining, reset_after, after(stop, now)
end
