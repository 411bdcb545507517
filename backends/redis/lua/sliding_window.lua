-- Tollgate: sliding window counter (Rust reference: algorithms/src/sliding_window.rs).
--
-- This file defines the algorithm (`sliding_window`), its refund (`refund_sliding_window`,
-- see layered.lua's refund mode), its reward (`reward_sliding_window`) and
-- the charge an admitted state marks (`charge_sliding_window`). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `sliding_window`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   sliding_window(limit, window_us, _, cur, prev, last, now, cost)
--
-- Layer ARGV: algorithm 4, cost, limit, window_us, 0.
-- State: cells {current count, previous count, last µs}, stored as the
--   string "a b c"; nil: none.
-- A request passes when prev × (W − e) + (cur + cost) × W ≤ limit × W, with e
-- the elapsed part of the current window.
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.

-- Whether the cells are a state a sliding window writes: counts below
-- 2^53 (Rust: within_reach). Any other is data Tollgate did not write.
local function sliding_window_understood(cur, prev, _)
  return cur < MAX_EXACT and prev < MAX_EXACT
end

-- The earliest instant a denied request of cost passes.
local function sliding_window_retry_at(limit, w, prev, cur, cost, start)
  -- Later in this window, as the previous window's weight fades:
  -- prev × (W − e') ≤ (limit − cur − cost) × W.
  if limit >= cur + cost and prev > 0 then
    local spare = (limit - cur - cost) * w
    local e_min = w - min(fdiv(spare, prev), w)
    if e_min < w then
      return start + e_min
    end
  end
  -- In the next window, where this window's count becomes the weighted one:
  -- cur × (W − e') ≤ (limit − cost) × W.
  local e_next = 0
  if cur ~= 0 then
    e_next = w - min(fdiv((limit - cost) * w, cur), w)
  end
  return start + w + e_next
end

local function sliding_window(limit, w, _, stored_cur, stored_prev, last, now, cost)
  if not stored_cur then
    stored_cur, stored_prev, last = 0, 0, now
  end
  local t = max(now, last)
  local start = t - mod(t, w)
  local last_start = last - mod(last, w)
  local prev, cur
  if last_start == start then
    prev, cur = stored_prev, stored_cur
  elseif last_start + w == start then
    prev, cur = stored_cur, 0
  else
    prev, cur = 0, 0
  end
  local e = t - start
  local budget = limit * w
  local used = prev * (w - e) + cur * w
  -- Rust compares used + cost × W ≤ budget; that sum can pass 2^53 (where
  -- doubles round), while used and budget − cost × W cannot for any state
  -- this policy wrote, so the comparison is moved to stay exact.
  local allowed = used <= budget - cost * w
  local cur_after = cur
  if allowed then
    cur_after = cur + cost
  end
  local used_after = prev * (w - e) + cur_after * w
  local reset_at = t
  if cur_after > 0 then
    reset_at = start + 2 * w
  elseif prev > 0 then
    reset_at = start + w
  end
  local remaining = 0
  if budget > used_after then
    remaining = fdiv(budget - used_after, w)
  end
  if allowed then
    return true, limit, remaining, after(reset_at, now), -1,
      ttl_ms(reset_at, now), cur_after, prev, t
  end
  local retry_at = sliding_window_retry_at(limit, w, prev, cur, cost, start)
  return false, limit, remaining, after(reset_at, now), after(retry_at, now)
end

-- Sliding window counter: the charge is in the current count while the
-- state is in the charge's window, and in the previous count once the state
-- has moved to the next window; later than that it no longer counts.
local function refund_sliding_window(_, w, _, cur, prev, last, now, cost, at)
  if not cur then
    return 0
  end
  if last < at then
    return 0
  end
  local start, charged = last - mod(last, w), at - mod(at, w)
  if start == charged then
    local give = min(cost, cur)
    if give <= 0 then
      return 0
    end
    return give, cur - give, prev, last
  elseif start == charged + w then
    local give = min(cost, prev)
    if give <= 0 then
      return 0
    end
    return give, cur, prev - give, last
  end
  return 0
end

-- A reward: the current window's count first, then the previous one's.
local function reward_sliding_window(p1, w, p3, a, b, c, now, units)
  local given, na, nb, nc = refund_sliding_window(p1, w, p3, a, b, c, now, units, c)
  if given < units then
    local from = na and { na, nb, nc } or { a, b, c }
    local more, xa, xb, xc = refund_sliding_window(p1, w, p3, from[1], from[2], from[3],
      now, units - given, c - w)
    if xa then
      na, nb, nc = xa, xb, xc
    end
    given = given + more
  end
  return given, na, nb, nc
end

-- The charge an admitted state marks: its time.
local function charge_sliding_window(_, _, last)
  return last, 0
end
